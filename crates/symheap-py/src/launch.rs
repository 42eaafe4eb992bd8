//! `launch`: the Rust launcher (`symheap launch`) behind `python -m symheap.launch`.

use std::time::Duration;

use pyo3::prelude::*;
use symheap_launch::{launch as rust_launch, LaunchOptions};

use crate::errors::{value_error, IntoPyResult};

/// Starts `n` PEs of `program args...` on this machine with a torchrun-style environment plus
/// `env`, prefixes their output with `[PE r]` (unless `prefix_output` is false), stops the others
/// `grace` seconds after one fails, and returns the exit status `symheap launch` would (0 when
/// every PE succeeded). Runs with the GIL released.
#[pyfunction]
#[pyo3(signature = (n, program, args = Vec::new(), env = Vec::new(), grace = 3.0, prefix_output = true))]
pub fn launch(
    py: Python<'_>,
    n: usize,
    program: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    grace: f64,
    prefix_output: bool,
) -> PyResult<i32> {
    if !(0.0..=symheap::config::MAX_TIMEOUT_SECS).contains(&grace) {
        return Err(value_error(format!(
            "grace={grace} is not accepted: expected 0 to 1e9 seconds"
        )));
    }
    let mut opts = LaunchOptions::new(n, program);
    opts.args = args.into_iter().map(Into::into).collect();
    opts.env = env;
    opts.grace = Duration::from_secs_f64(grace);
    opts.prefix_output = prefix_output;
    let outcome = py.detach(move || rust_launch(&opts)).py()?;
    Ok(outcome.exit_code())
}

/// Tells the runtime which directories (`sys.path`) to search for NVIDIA's pip wheels
/// (`nvidia-cuda-nvrtc`, `nvidia-nvshmem-cu13`) when it loads NVRTC or NVSHMEM.
#[pyfunction]
pub fn set_python_search_path(dirs: Vec<String>) {
    symheap::set_python_search_path(dirs.into_iter().map(Into::into).collect());
}
