//! What a newcomer sees from the command before anything works: `symheap info` on a machine
//! without NVRTC stays short (the search's every place only with `-v`), and a mistyped
//! subcommand is answered with visible subcommands only.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

const SYMHEAP: &str = env!("CARGO_BIN_EXE_symheap");

/// The longest line `symheap info` may print.
const MAX_LINE: usize = 160;

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A folder holding a `python3` that lists `dirs` long Python directories without NVRTC, as a
/// pyenv or conda interpreter does: the library search then has many places to report.
fn fake_python(name: &str, dirs: usize) -> (PathBuf, Vec<String>) {
    let d = std::env::temp_dir().join(format!("symheap-hints-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let listed: Vec<String> = (0..dirs)
        .map(|i| format!("/nonexistent/home/someone/.pyenv/versions/3.11.{i}/lib/python3.11"))
        .collect();
    common::fake_program(
        &d,
        "python3",
        &format!("printf '%s\\n' {}", listed.join(" ")),
    );
    (d, listed)
}

/// `symheap info ARGS` on the host backend, NVRTC searched for through `python3` of `bin` only.
fn info_without_nvrtc(bin: &std::path::Path, args: &[&str]) -> Output {
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new(SYMHEAP)
        .arg("info")
        .args(args)
        .env("PATH", path)
        .env("SYMHEAP_BACKEND", "host")
        .env_remove("SYMHEAP_NVRTC_LIB")
        .env_remove("SYMHEAP_PYTHON")
        .env_remove("SYMHEAP_PYTHON_PATH")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap()
}

#[test]
fn info_without_nvrtc_is_short_and_verbose_lists_every_place() {
    let (bin, dirs) = fake_python("info", 6);
    let out = info_without_nvrtc(&bin, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    for line in stdout.lines() {
        assert!(
            line.chars().count() <= MAX_LINE,
            "a line of {} characters: {line}",
            line.chars().count()
        );
    }
    let kernels = stdout
        .lines()
        .find(|l| l.starts_with("  kernels   :"))
        .unwrap_or_else(|| panic!("no kernels line: {stdout}"));
    // A machine whose loader finds NVRTC (a CUDA toolkit in ld.so.conf) reports it found; the
    // line is short then too, and there is no search to summarise.
    let found = kernels.contains("NVRTC 1");
    if !found {
        for needle in [
            "libnvrtc.so",
            "6 Python dirs",
            "loader path",
            "pip install nvidia-cuda-nvrtc",
            "SYMHEAP_NVRTC_LIB",
        ] {
            assert!(kernels.contains(needle), "missing {needle}: {kernels}");
        }
        assert!(
            !stdout.contains(&dirs[0]),
            "a searched place without -v: {stdout}"
        );
    }
    let out = info_without_nvrtc(&bin, &["--verbose"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    if !found {
        assert!(stdout.contains("NVRTC looked in:"), "{stdout}");
        for d in &dirs {
            let line = stdout
                .lines()
                .find(|l| l.contains(d.as_str()))
                .unwrap_or_else(|| panic!("{d} not listed: {stdout}"));
            assert!(line.contains("no such file"), "{line}");
        }
    }
    std::fs::remove_dir_all(&bin).unwrap();
}

/// The subcommands `symheap --help` lists.
fn visible_subcommands() -> Vec<String> {
    let out = Command::new(SYMHEAP).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn a_mistyped_subcommand_suggests_visible_ones_only() {
    let visible = visible_subcommands();
    assert!(
        visible.iter().any(|c| c == "bench") && !visible.iter().any(|c| c == "bench-pe"),
        "{visible:?}"
    );
    for (typo, want) in [
        ("bnech", "bench"),
        ("bench-p", "bench"),
        ("bench-pe-gp", "bench"),
        ("selftest-p", "selftest"),
    ] {
        let out = Command::new(SYMHEAP).arg(typo).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{typo}: {}", text(&out));
        let tip = err
            .lines()
            .find(|l| l.contains("tip:"))
            .unwrap_or_else(|| panic!("{typo}: no suggestion: {err}"));
        let named: Vec<&str> = tip.split('\'').skip(1).step_by(2).collect();
        assert!(named.contains(&want), "{typo}: {tip}");
        for n in &named {
            assert!(
                visible.iter().any(|c| c == n),
                "{typo}: suggests hidden {n}: {tip}"
            );
        }
    }
}
