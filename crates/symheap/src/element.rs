//! Element types that symmetric buffers, RMA, atomics and collectives work on.

use std::fmt;

/// Runtime tag of an element type (matches DLPack / torch names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// uint8
    U8,
    /// int8
    I8,
    /// uint16
    U16,
    /// int16
    I16,
    /// uint32
    U32,
    /// int32
    I32,
    /// uint64
    U64,
    /// int64
    I64,
    /// IEEE half
    F16,
    /// bfloat16
    BF16,
    /// float32
    F32,
    /// float64
    F64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 => 8,
        }
    }

    /// Lower-case name as in torch/numpy (`float32`, `bfloat16`...).
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::U16 => "uint16",
            DType::I16 => "int16",
            DType::U32 => "uint32",
            DType::I32 => "int32",
            DType::U64 => "uint64",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }

    /// Every dtype, for iteration in tests and parsers.
    pub const ALL: [DType; 12] = [
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Parses a name as printed by `name` (also `f32`, `i64`, `bf16`... short forms).
    pub fn parse(s: &str) -> Option<DType> {
        let s = s.trim().to_ascii_lowercase();
        DType::ALL.into_iter().find(|d| {
            d.name() == s
                || match d {
                    DType::U8 => s == "u8",
                    DType::I8 => s == "i8",
                    DType::U16 => s == "u16",
                    DType::I16 => s == "i16",
                    DType::U32 => s == "u32",
                    DType::I32 => s == "i32",
                    DType::U64 => s == "u64",
                    DType::I64 => s == "i64",
                    DType::F16 => s == "f16" || s == "half",
                    DType::BF16 => s == "bf16",
                    DType::F32 => s == "f32" || s == "float",
                    DType::F64 => s == "f64" || s == "double",
                }
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A plain element type symheap can move and reduce. Sealed: the set matches the kernels.
pub trait Element:
    bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + 'static + sealed::Sealed
{
    /// Its runtime tag.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()), Some(d));
        }
        assert_eq!(DType::parse("bf16"), Some(DType::BF16));
        assert_eq!(DType::parse("complex"), None);
        assert_eq!(<half::bf16 as Element>::DTYPE.size(), 2);
    }
}
