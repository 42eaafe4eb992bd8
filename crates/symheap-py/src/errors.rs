//! The exception classes and the mapping from `symheap::ErrorKind` to them.
//!
//! The classes are made at module import with `type(name, bases, dict)` because several of them
//! have more than one base (`SymheapValueError(SymheapError, ValueError, TypeError)`), which PyO3's
//! `create_exception!` cannot express.

use pyo3::exceptions::{PyException, PyMemoryError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use symheap::ErrorKind;

/// One exception class of the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// `SymheapError`, the base of every other.
    Base,
    /// Invalid argument: also a `ValueError`.
    Value,
    /// Out of symmetric memory: also a `MemoryError`.
    Memory,
    /// A wait ran out of time: also a `TimeoutError`.
    Timeout,
    /// Another PE exited or the job aborted.
    Peer,
    /// PEs made different collective calls.
    Mismatch,
    /// Valid, but this backend or machine cannot do it.
    Unsupported,
}

const ALL: [Class; 7] = [
    Class::Base,
    Class::Value,
    Class::Memory,
    Class::Timeout,
    Class::Peer,
    Class::Mismatch,
    Class::Unsupported,
];

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::Base => "SymheapError",
            Class::Value => "SymheapValueError",
            Class::Memory => "SymheapMemoryError",
            Class::Timeout => "SymheapTimeoutError",
            Class::Peer => "SymheapPeerError",
            Class::Mismatch => "SymheapMismatchError",
            Class::Unsupported => "SymheapUnsupportedError",
        }
    }

    fn doc(self) -> &'static str {
        match self {
            Class::Base => "Base class of every symheap failure. Attributes: `kind` (a snake_case name of the Rust ErrorKind, or None for errors raised by the Python layer), `pe` (the PE it happened on, or None), `call` (the symheap call that failed, or None) and `missing` (for timeouts, the PEs that did not arrive).",
            Class::Value => "An argument was rejected before any memory was touched (wrong type, size, dtype, PE out of range, memory not in the symmetric heap). Also a ValueError and a TypeError.",
            Class::Memory => "The symmetric heap cannot hold the request (on any PE: the heap is symmetric).",
            Class::Timeout => "A wait ran out of time (SYMHEAP_TIMEOUT); `missing` names the PEs that did not arrive when known.",
            Class::Peer => "Another PE exited, or the job was aborted because a PE failed.",
            Class::Mismatch => "PEs made different collective calls, or the same call with different arguments.",
            Class::Unsupported => "The request is valid but this backend, build or machine cannot do it.",
        }
    }

    fn slot(self) -> usize {
        ALL.iter().position(|&c| c == self).expect("listed")
    }
}

static CLASSES: [PyOnceLock<Py<PyType>>; 7] = [
    PyOnceLock::new(),
    PyOnceLock::new(),
    PyOnceLock::new(),
    PyOnceLock::new(),
    PyOnceLock::new(),
    PyOnceLock::new(),
    PyOnceLock::new(),
];

/// Whether `e` is a `SymheapError` (any of its subclasses, the Python layer's included).
pub fn is_symheap_error(py: Python<'_>, e: &PyErr) -> bool {
    class(py, Class::Base).is_ok_and(|base| e.is_instance(py, &base))
}

/// The class object for `c` (made on first use).
pub fn class(py: Python<'_>, c: Class) -> PyResult<Bound<'_, PyType>> {
    if let Some(t) = CLASSES[c.slot()].get(py) {
        return Ok(t.bind(py).clone());
    }
    let base_bases: Vec<Bound<'_, PyType>> = match c {
        Class::Base => vec![py.get_type::<PyException>()],
        // Also a TypeError: a wrong argument type (a list for a PE) is one of its causes, and
        // code written against plain Python's TypeError keeps catching it.
        Class::Value => vec![
            class(py, Class::Base)?,
            py.get_type::<PyValueError>(),
            py.get_type::<PyTypeError>(),
        ],
        Class::Memory => vec![class(py, Class::Base)?, py.get_type::<PyMemoryError>()],
        Class::Timeout => vec![class(py, Class::Base)?, py.get_type::<PyTimeoutError>()],
        _ => vec![class(py, Class::Base)?],
    };
    let dict = PyDict::new(py);
    dict.set_item("__module__", "symheap")?;
    dict.set_item("__doc__", c.doc())?;
    if c == Class::Base {
        for attr in ["kind", "pe", "call"] {
            dict.set_item(attr, py.None())?;
        }
        dict.set_item("missing", PyTuple::empty(py))?;
    }
    let ty = py
        .get_type::<PyType>()
        .call1((c.name(), PyTuple::new(py, base_bases)?, dict))?
        .cast_into::<PyType>()?;
    let _ = CLASSES[c.slot()].set(py, ty.clone().unbind());
    Ok(CLASSES[c.slot()]
        .get(py)
        .expect("just set")
        .bind(py)
        .clone())
}

/// Adds every class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for c in ALL {
        m.add(c.name(), class(m.py(), c)?)?;
    }
    Ok(())
}

fn classify(kind: &ErrorKind) -> (Class, &'static str) {
    match kind {
        ErrorKind::InvalidArgument(_) => (Class::Value, "invalid_argument"),
        ErrorKind::OutOfMemory { .. } => (Class::Memory, "out_of_memory"),
        ErrorKind::Timeout { .. } => (Class::Timeout, "timeout"),
        ErrorKind::PeerExited { .. } => (Class::Peer, "peer_exited"),
        ErrorKind::Aborted { .. } => (Class::Peer, "aborted"),
        ErrorKind::CollectiveMismatch(_) => (Class::Mismatch, "collective_mismatch"),
        ErrorKind::Unsupported(_) => (Class::Unsupported, "unsupported"),
        ErrorKind::Bootstrap(_) => (Class::Base, "bootstrap"),
        ErrorKind::Backend(_) => (Class::Base, "backend"),
        ErrorKind::Finalized => (Class::Base, "finalized"),
        _ => (Class::Base, "other"),
    }
}

fn build(py: Python<'_>, e: &symheap::Error) -> PyResult<PyErr> {
    let (c, name) = classify(e.kind());
    let inst = class(py, c)?.call1((e.to_string(),))?;
    inst.setattr("kind", name)?;
    inst.setattr("pe", e.pe())?;
    inst.setattr("call", e.call())?;
    if let ErrorKind::Timeout { missing, .. } = e.kind() {
        inst.setattr("missing", PyTuple::new(py, missing)?)?;
    }
    Ok(PyErr::from_value(inst))
}

/// The Python exception for a symheap error, carrying its message, PE, call and kind.
pub fn to_py(e: symheap::Error) -> PyErr {
    Python::attach(|py| build(py, &e).unwrap_or_else(|other| other))
}

/// An exception of class `c` with `msg` (for checks made in the binding itself).
pub fn raise(c: Class, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    Python::attach(|py| match class(py, c).and_then(|t| t.call1((msg,))) {
        Ok(inst) => PyErr::from_value(inst),
        Err(e) => e,
    })
}

/// Shorthand: `SymheapValueError(msg)`.
pub fn value_error(msg: impl Into<String>) -> PyErr {
    raise(Class::Value, msg)
}

/// `.py()` on a symheap result: converts the error.
pub trait IntoPyResult<T> {
    /// The result with the error mapped to its Python exception.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for symheap::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
