//! The `symheap` command as a library: the binary (`src/main.rs`) and the Python package's
//! `symheap` console script (`python -m symheap`) both call [`run`], so a pip install gives the
//! same command as a cargo build, with no Rust toolchain.

mod bench;
mod cli;
mod kernels;
mod selfcmd;
mod selftest;

use std::ffi::OsString;
use std::process::ExitCode;

pub use selfcmd::set_self_command;

/// Runs the command line `args` (the program name first, as `std::env::args_os` gives it) and
/// returns its exit status. The PEs that `selftest` and `bench` start run this same command
/// again: the current executable, unless [`set_self_command`] said otherwise.
pub fn run(args: Vec<OsString>) -> ExitCode {
    ExitCode::from(run_status(args) as u8)
}

/// [`run`], returning the exit status as a number (0 to 255; for callers that are not `main`).
pub fn run_status(args: Vec<OsString>) -> i32 {
    cli::run(args)
}
