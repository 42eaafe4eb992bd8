//! Python arguments as symheap's types: dtype, comparison, signal, reduction, algorithm and
//! atomic names, element values as bits, and stream handles.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat};
use symheap::{AllReduceAlgo, AtomicOp, Cmp, CollParam, CollParams, DType, SignalOp};

use crate::errors::value_error;

/// Parses a dtype name (`float32`, `int64`, `bfloat16`, `f32`...).
pub(crate) fn parse_dtype(name: &str) -> PyResult<DType> {
    // The Python layer passes canonical names on every put and get: found without the
    // lower-casing copy `DType::parse` makes.
    if let Some(d) = DType::ALL.into_iter().find(|d| d.name() == name) {
        return Ok(d);
    }
    DType::parse(name).ok_or_else(|| {
        value_error(format!(
            "unsupported dtype {name:?}; symheap supports {}",
            DType::ALL.map(|d| d.name()).join(", ")
        ))
    })
}

pub(crate) fn parse_cmp(s: &str) -> PyResult<Cmp> {
    Cmp::parse(s).ok_or_else(|| {
        value_error(format!(
            "unknown comparison {s:?}; use eq, ne, gt, ge, lt, le (or == != > >= < <=)"
        ))
    })
}

pub(crate) fn parse_signal_op(s: &str) -> PyResult<SignalOp> {
    match s.trim().to_ascii_lowercase().as_str() {
        "set" => Ok(SignalOp::Set),
        "add" => Ok(SignalOp::Add),
        _ => Err(value_error(format!(
            "unknown signal op {s:?}; use \"set\" or \"add\""
        ))),
    }
}

pub(crate) fn parse_algo(s: &str) -> PyResult<AllReduceAlgo> {
    AllReduceAlgo::parse(s).ok_or_else(|| {
        value_error(format!(
            "unknown all_reduce algorithm {s:?}; use auto, one_shot, two_shot"
        ))
    })
}

/// A collective's keyword parameters as symheap's: integers, strings, and sequences of
/// integers (a bool is refused: it is an int to Python, but never a count or a root).
pub(crate) fn coll_params(kw: Option<&Bound<'_, PyDict>>) -> PyResult<CollParams> {
    let mut p = CollParams::new();
    for (k, v) in kw.into_iter().flat_map(|d| d.iter()) {
        let name: String = k.extract()?;
        let bad = || {
            value_error(format!(
                "{name} must be an integer, a string or a list of integers, not {v}"
            ))
        };
        let value = if v.is_instance_of::<PyBool>() {
            return Err(bad());
        } else if let Ok(s) = v.extract::<String>() {
            CollParam::Str(s)
        } else if let Ok(i) = v.extract::<i64>() {
            CollParam::Int(i)
        } else if let Ok(l) = v.extract::<Vec<Bound<'_, PyAny>>>() {
            let mut ints = Vec::with_capacity(l.len());
            for x in l {
                if x.is_instance_of::<PyBool>() {
                    return Err(bad());
                }
                ints.push(x.extract::<i64>().map_err(|_| bad())?);
            }
            CollParam::Ints(ints)
        } else {
            return Err(bad());
        };
        p.set(&name, value);
    }
    Ok(p)
}

pub(crate) fn parse_atomic(s: &str) -> PyResult<AtomicOp> {
    Ok(match s.trim().to_ascii_lowercase().as_str() {
        "fetch" | "load" => AtomicOp::Load,
        "set" | "store" => AtomicOp::Store,
        "swap" => AtomicOp::Swap,
        "compare_swap" | "cas" => AtomicOp::CompareSwap,
        "add" | "fetch_add" => AtomicOp::Add,
        "and" => AtomicOp::And,
        "or" => AtomicOp::Or,
        "xor" => AtomicOp::Xor,
        _ => {
            return Err(value_error(format!(
                "unknown atomic {s:?}; use fetch, set, swap, compare_swap, add, and, or, xor"
            )))
        }
    })
}

/// An atomic call's arguments from Python: the op, the word's dtype, and the operand and
/// compare value as `dtype` bits (0 where absent). `value` is required except for `fetch`,
/// `compare` for `compare_swap`.
pub(crate) fn atomic_args(
    op: &str,
    dtype: &str,
    value: Option<Bound<'_, PyAny>>,
    compare: Option<Bound<'_, PyAny>>,
) -> PyResult<(AtomicOp, DType, u64, u64)> {
    let op = parse_atomic(op)?;
    let dt = parse_dtype(dtype)?;
    if value.is_none() && op != AtomicOp::Load {
        return Err(value_error(format!("atomic {} needs a value", op.name())));
    }
    if compare.is_none() && op == AtomicOp::CompareSwap {
        return Err(value_error("compare_swap needs the compare value"));
    }
    let bits = |v: Option<Bound<'_, PyAny>>| v.map_or(Ok(0), |v| to_bits(&v, dt));
    Ok((op, dt, bits(value)?, bits(compare)?))
}

/// The bits of Python number `v` as a `dtype` word. A value the dtype does not hold is refused,
/// naming the dtype's range: integers must lie in it (nothing wraps), and a finite float must
/// not overflow float32 (an explicit inf or nan is taken as such).
pub(crate) fn to_bits(v: &Bound<'_, PyAny>, dtype: DType) -> PyResult<u64> {
    match dtype {
        DType::F32 | DType::F64 => float_bits(v, dtype),
        DType::I32 | DType::U32 | DType::I64 | DType::U64 => int_bits(v, dtype),
        _ => Err(value_error(format!(
            "atomics are defined on int32, uint32, int64, uint64 (and fetch/set/swap on float32, float64), not {dtype}"
        ))),
    }
}

/// The values an integer dtype holds, and how its range reads in a message.
fn int_range(dtype: DType) -> (i128, i128, &'static str) {
    match dtype {
        DType::I32 => (i32::MIN.into(), i32::MAX.into(), "[-2^31, 2^31-1]"),
        DType::U32 => (0, u32::MAX.into(), "[0, 2^32-1]"),
        DType::I64 => (i64::MIN.into(), i64::MAX.into(), "[-2^63, 2^63-1]"),
        _ => (0, u64::MAX.into(), "[0, 2^64-1]"),
    }
}

fn int_bits(v: &Bound<'_, PyAny>, dtype: DType) -> PyResult<u64> {
    let (lo, hi, range) = int_range(dtype);
    let out_of_range = |shown: String| {
        value_error(format!(
            "atomic operand {shown} is out of range for {dtype}: it holds {range} ({lo} to {hi})"
        ))
    };
    let x: i128 = match v.extract() {
        Ok(x) => x,
        // An integer past 128 bits: out of range all the same.
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(v.py()) => {
            return Err(out_of_range(v.to_string()))
        }
        Err(_) => {
            return Err(value_error(format!(
                "atomic operand {v} is not an integer (dtype {dtype})"
            )))
        }
    };
    if x < lo || x > hi {
        return Err(out_of_range(x.to_string()));
    }
    let bits = 8 * dtype.size() as u32;
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    // Two's complement of a negative value, cut to the word: exact, as it is in range.
    Ok((x as u64) & mask)
}

fn float_bits(v: &Bound<'_, PyAny>, dtype: DType) -> PyResult<u64> {
    let range = |x: String| {
        let max = if dtype == DType::F32 {
            f64::from(f32::MAX)
        } else {
            f64::MAX
        };
        value_error(format!(
            "atomic operand {x} is out of range for {dtype}: finite values in [{:e}, {max:e}] \
             (inf and nan are taken when passed as such)",
            -max
        ))
    };
    let x: f64 = match v.extract() {
        Ok(x) => x,
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(v.py()) => {
            return Err(range(v.to_string()))
        }
        Err(_) => {
            return Err(value_error(format!(
                "atomic operand {v} is not a number (dtype {dtype})"
            )))
        }
    };
    if dtype == DType::F64 {
        return Ok(x.to_bits());
    }
    // Rounded to the nearest float32; a finite value past float32's largest overflows to inf.
    let f = x as f32;
    if f.is_infinite() && x.is_finite() {
        return Err(range(format!("{x:e}")));
    }
    Ok(u64::from(f.to_bits()))
}

pub(crate) fn from_bits(py: Python<'_>, bits: u64, dtype: DType) -> PyResult<Py<PyAny>> {
    Ok(match dtype {
        DType::F32 => PyFloat::new(py, f32::from_bits(bits as u32) as f64)
            .into_any()
            .unbind(),
        DType::F64 => PyFloat::new(py, f64::from_bits(bits)).into_any().unbind(),
        DType::I32 => (bits as u32 as i32).into_pyobject(py)?.into_any().unbind(),
        DType::U32 => (bits as u32).into_pyobject(py)?.into_any().unbind(),
        DType::I64 => (bits as i64).into_pyobject(py)?.into_any().unbind(),
        _ => bits.into_pyobject(py)?.into_any().unbind(),
    })
}

/// A PE, index or offset from Python: anything with `__index__` that fits, except a bool (an
/// int to Python, but `True` as a PE or an offset is a mistake, not a 1).
pub(crate) fn index_arg(v: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    if v.is_instance_of::<PyBool>() {
        return Err(value_error(format!(
            "{what} must be an integer, not bool ({v})"
        )));
    }
    v.extract::<usize>()
        .map_err(|_| value_error(format!("{what} must be a non-negative integer, not {v}")))
}

/// The stream a Python call names (a `cuda_stream` integer from torch or CuPy; the legacy
/// default stream when omitted).
pub(crate) fn stream_or(stream: Option<u64>) -> symheap::Stream {
    // SAFETY: Python hands over stream handles as integers, as every CUDA Python API does
    // (torch's `cuda_stream`, CuPy's `ptr`): keeping the stream alive while symheap uses it is
    // the Python program's part, as it is for those libraries. symheap checks on each call that
    // the handle is a stream of this PE's device.
    unsafe { symheap::Stream::from_raw(stream.unwrap_or(0)) }
}
