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

macro_rules! int_reduce {
    ($t:ty, $dst:expr, $srcs:expr, $op:expr) => {{
        let n = $dst.len() / std::mem::size_of::<$t>();
        for i in 0..n {
            let at = |s: &[u8]| {
                let b = &s[i * std::mem::size_of::<$t>()..(i + 1) * std::mem::size_of::<$t>()];
                <$t>::from_le_bytes(b.try_into().expect("element"))
            };
            let mut acc = at($srcs[0]);
            for s in &$srcs[1..] {
                let x = at(s);
                acc = match $op {
                    ReduceOp::Sum => acc.wrapping_add(x),
                    ReduceOp::Prod => acc.wrapping_mul(x),
                    ReduceOp::Min => acc.min(x),
                    ReduceOp::Max => acc.max(x),
                };
            }
            $dst[i * std::mem::size_of::<$t>()..(i + 1) * std::mem::size_of::<$t>()]
                .copy_from_slice(&acc.to_le_bytes());
        }
    }};
}

macro_rules! float_reduce {
    ($t:ty, $acc:ty, $to:expr, $from:expr, $dst:expr, $srcs:expr, $op:expr) => {{
        const W: usize = std::mem::size_of::<$t>();
        let n = $dst.len() / W;
        for i in 0..n {
            let at = |s: &[u8]| -> $acc {
                let b = &s[i * W..(i + 1) * W];
                $to(<$t>::from_le_bytes(b.try_into().expect("element")))
            };
            let mut acc = at($srcs[0]);
            for s in &$srcs[1..] {
                let x = at(s);
                acc = match $op {
                    ReduceOp::Sum => acc + x,
                    ReduceOp::Prod => acc * x,
                    ReduceOp::Min => acc.min(x),
                    ReduceOp::Max => acc.max(x),
                };
            }
            let out: $t = $from(acc);
            $dst[i * W..(i + 1) * W].copy_from_slice(&out.to_le_bytes());
        }
    }};
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
        DType::F32 => float_reduce!(f32, f32, |x| x, |x| x, dst, srcs, op),
        DType::F64 => float_reduce!(f64, f64, |x| x, |x| x, dst, srcs, op),
        DType::F16 => float_reduce!(f16, f32, f16::to_f32, f16::from_f32, dst, srcs, op),
        DType::BF16 => float_reduce!(bf16, f32, bf16::to_f32, bf16::from_f32, dst, srcs, op),
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
