//! The `symheap` command: launch PEs, show what symheap sees, self-test, benchmark.

fn main() -> std::process::ExitCode {
    symheap_cli::run(std::env::args_os().collect())
}
