//! Helpers shared by the integration tests.

use std::path::Path;
use std::process::Command;

/// Writes an executable shell script `dir/name` with `body` (after `#!/bin/sh`), through a child
/// process: a file this (multi-threaded) test process had open for writing could leak into a
/// program another test forks at that moment, and executing it would then fail with "text file
/// busy".
pub fn fake_program(dir: &Path, name: &str, body: &str) {
    let draft = dir.join(format!("{name}.draft"));
    std::fs::write(&draft, format!("#!/bin/sh\n{body}\n")).unwrap();
    let status = Command::new("install")
        .arg("-m")
        .arg("755")
        .arg(&draft)
        .arg(dir.join(name))
        .status()
        .expect("run install(1)");
    assert!(status.success());
}
