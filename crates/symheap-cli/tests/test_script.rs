//! scripts/test.sh's Open MPI step (scripts/lib/open_mpi.sh): it says what it installs, why and
//! how to skip it before apt-get runs; with SYMHEAP_NO_APT=1 it installs nothing and leaves out
//! exactly the tests that start mpirun, named as skipped.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn folder(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("symheap-testsh-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `script` after sourcing open_mpi.sh under `set -euo pipefail`, with PATH = `bin` then
/// the system folders that hold bash's helpers (no mpirun in either).
fn run(bin: &Path, env: &[(&str, &str)], script: &str) -> Output {
    let lib = root().join("scripts/lib/open_mpi.sh");
    let mut cmd = Command::new(system_program("bash"));
    cmd.arg("-c")
        .arg(format!(
            "set -euo pipefail\nsource '{}'\n{script}",
            lib.display()
        ))
        .env("PATH", bin)
        .env_remove("SYMHEAP_NO_APT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Where `name` is on this process's PATH (the fakes' PATH has only them).
fn system_program(name: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no {name} on PATH"))
}

/// A folder of fake programs: `id` (uid `uid`), `sudo` and `apt-get`, each saying on stderr
/// that it ran (so its place among the messages shows), apt-get "installing" a fake mpirun.
fn fakes(d: &Path, uid: u32) -> PathBuf {
    let bin = d.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    common::fake_program(&bin, "id", &format!("echo {uid}"));
    common::fake_program(&bin, "sudo", "echo \"RAN sudo $*\" >&2\nexec \"$@\"");
    let mpirun = bin.join("mpirun");
    common::fake_program(
        &bin,
        "apt-get",
        &format!(
            "echo \"RAN apt-get $*\" >&2\n\
             [ \"$1\" = install ] && printf '#!/bin/sh\\n' > '{0}' && '{1}' 755 '{0}'\nexit 0",
            mpirun.display(),
            system_program("chmod").display()
        ),
    );
    bin
}

#[test]
fn the_install_is_said_before_it_runs_and_goes_through_sudo_for_a_user() {
    for (uid, sudo) in [(1000, true), (0, false)] {
        let d = folder(&format!("apt{uid}"));
        let bin = fakes(&d, uid);
        let out = run(
            &bin,
            &[],
            "open_mpi_for_tests\necho \"skip=${#OPEN_MPI_SKIP_ARGS[@]}\"",
        );
        let all = text(&out);
        assert!(out.status.success(), "{all}");
        let err = String::from_utf8_lossy(&out.stderr);
        let said = err
            .find("installing Open MPI (apt-get install openmpi-bin")
            .unwrap_or_else(|| panic!("not said: {all}"));
        let ran = err
            .find("RAN ")
            .unwrap_or_else(|| panic!("apt-get not run: {all}"));
        assert!(said < ran, "said after it ran: {all}");
        for needle in ["outside target/", "mpirun", "SYMHEAP_NO_APT=1"] {
            assert!(err[..ran].contains(needle), "missing {needle}: {all}");
        }
        assert_eq!(err.contains("RAN sudo apt-get install"), sudo, "{all}");
        assert_eq!(err[..ran].contains("through sudo"), sudo, "{all}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("skip=0"),
            "{all}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[test]
fn no_apt_installs_nothing_and_names_the_skipped_tests() {
    let d = folder("noapt");
    let bin = fakes(&d, 1000);
    let out = run(
        &bin,
        &[("SYMHEAP_NO_APT", "1")],
        "open_mpi_for_tests\necho \"args=${OPEN_MPI_SKIP_ARGS[*]}\"\nopen_mpi_skipped_note",
    );
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(!all.contains("RAN "), "installed something: {all}");
    let args = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    let tests = mpirun_tests();
    assert!(!tests.is_empty());
    for t in &tests {
        assert!(
            args.contains(&format!("--skip {t}")),
            "{t} not left out: {all}"
        );
    }
    let note = err
        .lines()
        .find(|l| l.contains("SKIPPED, not passed"))
        .unwrap_or_else(|| panic!("no skip note: {all}"));
    for t in &tests {
        assert!(note.contains(t.as_str()), "{t} not named: {note}");
    }
    // With mpirun present nothing is skipped and nothing is installed.
    common::fake_program(&bin, "mpirun", "exit 0");
    let out = run(
        &bin,
        &[("SYMHEAP_NO_APT", "1")],
        "open_mpi_for_tests\necho \"skip=${#OPEN_MPI_SKIP_ARGS[@]}\"\nopen_mpi_skipped_note",
    );
    let all = text(&out);
    assert!(out.status.success() && all.contains("skip=0"), "{all}");
    assert!(!all.contains("SKIPPED") && !all.contains("RAN "), "{all}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// The tests in the workspace's sources that start mpirun: each `#[test]` function whose text
/// (up to the next test) makes a `Command` of mpirun.
fn mpirun_tests() -> Vec<String> {
    let mut files = Vec::new();
    let mut dirs = vec![root().join("crates")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut out = Vec::new();
    for f in files {
        let src = std::fs::read_to_string(&f).unwrap();
        for chunk in src.split("#[test]").skip(1) {
            if !chunk.contains("Command::new(\"mpirun\")") {
                continue;
            }
            let name = chunk
                .split("fn ")
                .nth(1)
                .and_then(|s| s.split('(').next())
                .unwrap_or_else(|| panic!("{}: a test without fn", f.display()));
            out.push(name.trim().to_string());
        }
    }
    out.sort();
    out
}

#[test]
fn the_skip_list_is_every_test_that_starts_mpirun() {
    let d = folder("list");
    let out = run(&d, &[], "printf '%s\\n' \"${OPEN_MPI_TESTS[@]}\"");
    assert!(out.status.success(), "{}", text(&out));
    let mut listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        mpirun_tests(),
        "scripts/lib/open_mpi.sh's OPEN_MPI_TESTS is not the list of tests that start mpirun"
    );
    std::fs::remove_dir_all(&d).unwrap();
}
