//! How the command starts itself again: `selftest` and `bench` launch PEs that run a hidden
//! subcommand of this same command.

use std::ffi::OsString;
use std::process::Command;
use std::sync::Mutex;

static SELF_COMMAND: Mutex<Option<Vec<OsString>>> = Mutex::new(None);

/// Sets the program (and leading arguments) that starts this command, e.g.
/// `[sys.executable, "-m", "symheap"]` inside the Python package, where the current executable
/// is the Python interpreter. An empty vector restores the default (the current executable).
pub fn set_self_command(argv: Vec<OsString>) {
    *SELF_COMMAND.lock().unwrap_or_else(|p| p.into_inner()) = Some(argv).filter(|a| !a.is_empty());
}

/// The program and leading arguments that run this command.
pub(crate) fn argv() -> Vec<OsString> {
    if let Some(a) = SELF_COMMAND
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
    {
        return a;
    }
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
