//! The `symheap` command as a library: the binary (`src/main.rs`) and the Python package's
//! `symheap` console script (`python -m symheap`) both call [`run`], so a pip install gives the
//! same command as a cargo build, with no Rust toolchain.

mod bench;
mod cli;
mod kernels;
mod selfcmd;
mod selftest;
mod tools;

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

/// Sends symheap's `tracing` events (refused rendezvous connections, warnings) to stderr,
/// filtered by `SYMHEAP_LOG` (default `warn`). The command does this itself; the Python package
/// calls it at import. A second call, or a program with its own subscriber, keeps the first.
pub fn init_logging() {
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
