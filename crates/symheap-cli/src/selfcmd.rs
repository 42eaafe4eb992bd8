//! How the command starts itself again, and what it learns from the Python package that runs it.
//!
//! `selftest` and `bench` launch PEs that run a hidden subcommand of this same executable. Inside
//! a pip install the executable ships in the package (`symheap/_bin/symheap`) and the
//! package's `symheap` console script (or `python -m symheap`) execs it, passing in the
//! environment what only the interpreter knows: itself ([`PYTHON_VAR`]), which draws `bench
//! --png` charts, and its `sys.path` ([`PYTHON_PATH_VAR`]), where NVIDIA's pip wheels (NVRTC,
//! NCCL, NVSHMEM) are found. The PEs inherit both.

use std::ffi::OsString;
use std::process::Command;

/// The Python interpreter that runs this command, when it runs from the Python package.
pub(crate) const PYTHON_VAR: &str = "SYMHEAP_PYTHON";
/// That interpreter's `sys.path` (joined with `:`), searched for NVIDIA's pip wheels.
pub(crate) const PYTHON_PATH_VAR: &str = "SYMHEAP_PYTHON_PATH";

/// Hands the Python package's `sys.path` ([`PYTHON_PATH_VAR`]) to the runtime's library search;
/// without it the runtime asks the `python3` on PATH, which may not be the one the wheels are in.
pub(crate) fn adopt_python_path() {
    if let Some(p) = std::env::var_os(PYTHON_PATH_VAR).filter(|p| !p.is_empty()) {
        let dirs = std::env::split_paths(&p).filter(|d| !d.as_os_str().is_empty());
        symheap::set_python_search_path(dirs.collect());
    }
}

/// The Python interpreter that runs this command ([`PYTHON_VAR`]), if it runs from the package.
pub(crate) fn python() -> Option<OsString> {
    std::env::var_os(PYTHON_VAR).filter(|p| !p.is_empty())
}

/// The program (and leading arguments) that run this command: the current executable.
pub(crate) fn argv() -> Vec<OsString> {
    let exe = std::env::current_exe()
        .map(OsString::from)
        .or_else(|_| std::env::args_os().next().ok_or(()))
        .unwrap_or_else(|_| OsString::from("symheap"));
    vec![exe]
}

/// A `Command` that runs this command (arguments still to be added).
pub(crate) fn command() -> Command {
    let argv = argv();
    let mut c = Command::new(&argv[0]);
    c.args(&argv[1..]);
    c
}
