//! `symheap._native`: the Python extension module of symheap (PyO3, abi3 for CPython 3.9+).
//!
//! It exposes the Rust runtime on raw symmetric addresses: `Context` (init, rank information,
//! allocation, RMA, atomics, signals, barriers, teams, collectives), `SymmetricBuffer` and
//! `HeapView` (memory exported through DLPack and the array interfaces), `NvshmemProvider`
//! (NVSHMEM as an allocator satisfying the contract), `launch`, and the exception classes. The
//! `symheap` Python package builds the array/tensor API on top. The `symheap` command is a
//! separate executable (crate `symheap-cli`) that the package carries and runs: its self-test
//! scenarios and benchmarks are not linked into this module.

mod buffer;
mod coll;
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
    convert::parse_dtype(name).map(DType::size)
}

/// The canonical name of a dtype (`f32` -> `float32`).
#[pyfunction]
fn dtype_name(name: &str) -> PyResult<&'static str> {
    convert::parse_dtype(name).map(DType::name)
}

/// Sends symheap's `tracing` events (refused rendezvous connections, a joinable job) to
/// stderr, filtered by `SYMHEAP_LOG` (default `warn`). A program with its own subscriber keeps
/// it.
fn init_logging() {
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        // Colour codes only for a person at a terminal, not in logs and captured output.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SYMHEAP_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Warnings (refused rendezvous connections, a joinable job) reach stderr, per SYMHEAP_LOG.
    init_logging();
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
    m.add_function(wrap_pyfunction!(launch::set_python_search_path, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_size, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_name, m)?)?;
    Ok(())
}
