//! `symheap._native`: the Python extension module of symheap (PyO3, abi3 for CPython 3.9+).
//!
//! It exposes the Rust runtime on raw symmetric addresses: `Context` (init, rank information,
//! allocation, RMA, atomics, signals, barriers, teams, collectives), `SymmetricBuffer` and
//! `HeapView` (memory exported through DLPack and the array interfaces), `NvshmemProvider`
//! (NVSHMEM as an allocator satisfying the contract), `launch`, the `symheap` command
//! (`cli_main`), and the exception classes. The `symheap` Python package builds the
//! array/tensor API on top.

mod buffer;
mod context;
mod convert;
mod dlpack;
mod errors;
mod launch;
mod provider;
mod store;
mod team;

use pyo3::prelude::*;
use symheap::DType;

/// Bytes per element of a dtype name.
#[pyfunction]
fn dtype_size(name: &str) -> PyResult<usize> {
    buffer::parse_dtype(name).map(DType::size)
}

/// The canonical name of a dtype (`f32` -> `float32`).
#[pyfunction]
fn dtype_name(name: &str) -> PyResult<&'static str> {
    buffer::parse_dtype(name).map(DType::name)
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Warnings (refused rendezvous connections, a joinable job) reach stderr, per SYMHEAP_LOG.
    symheap_cli::init_logging();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add(
        "DTYPES",
        DType::ALL.iter().map(|d| d.name()).collect::<Vec<_>>(),
    )?;
    errors::register(m)?;
    m.add_class::<context::PyContext>()?;
    m.add_class::<team::PyTeam>()?;
    m.add_class::<buffer::SymmetricBuffer>()?;
    m.add_class::<buffer::HeapView>()?;
    m.add_class::<provider::PyNvshmem>()?;
    m.add_function(wrap_pyfunction!(launch::launch, m)?)?;
    m.add_function(wrap_pyfunction!(launch::cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(launch::set_python_search_path, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_size, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_name, m)?)?;
    Ok(())
}
