//! The `symheap` command: launch PEs, show what symheap sees, self-test, benchmark, compile the
//! kernels ahead of time. A cargo build gives it as `target/*/symheap`; the wheel carries the
//! same executable inside the Python package, which the `symheap` console script and `python -m
//! symheap` run. The Python extension module does not link this crate: its self-test scenarios
//! and benchmark peers stay out of what `import symheap` loads.

mod bench;
mod cli;
mod kernels;
mod load_error;
mod selfcmd;
mod selftest;

fn main() -> std::process::ExitCode {
    selfcmd::adopt_python_path();
    std::process::ExitCode::from(cli::run(std::env::args_os().collect()) as u8)
}

/// Sends symheap's `tracing` events (refused rendezvous connections, warnings) to stderr,
/// filtered by `SYMHEAP_LOG` (default `warn`).
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
