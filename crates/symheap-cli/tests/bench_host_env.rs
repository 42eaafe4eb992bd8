//! `symheap bench` and the machine it runs on: more PEs than CPU cores is warned about, a
//! benchmark stopped by a signal leaves neither its scratch folder nor its programs behind, and
//! an Open MPI without its headers (or no Open MPI) costs the MPI column only, with the reason
//! and what to install.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

const SYMHEAP: &str = env!("CARGO_BIN_EXE_symheap");

/// A fresh folder for one test: `TMPDIR` of the benchmark (its scratch folder goes there) and
/// `bin/` for fake programs.
fn folder(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("symheap-benchenv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("bin")).unwrap();
    d
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `symheap bench --host ARGS` with `dir` as TMPDIR and `path` as PATH.
fn bench(dir: &Path, path: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(SYMHEAP);
    cmd.arg("bench")
        .arg("--host")
        .args(args)
        .env("TMPDIR", dir)
        .env("PATH", path)
        .env("SYMHEAP_HEAP_CAPACITY", "1G")
        .env("SYMHEAP_TIMEOUT", "60");
    cmd
}

/// PATH with `bin` first.
fn path_with(bin: &Path) -> String {
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The benchmark scratch folders (`symheap-bench-*`) in `dir`.
fn scratch_folders(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("symheap-bench-"))
        })
        .collect()
}

const WARNING: &str = "bench: warning:";

#[test]
fn more_pes_than_cores_is_warned_about() {
    let cpus: Vec<usize> = {
        let set = sched_getaffinity(Pid::from_raw(0)).unwrap();
        (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect()
    };
    let d = folder("cores");
    let path = std::env::var("PATH").unwrap_or_default();
    // The benchmark inherits this thread's CPUs, and counts the cores it may use.
    let run_on = |n_cpus: usize| {
        let mut set = CpuSet::new();
        for &c in &cpus[..n_cpus] {
            set.set(c).unwrap();
        }
        sched_setaffinity(Pid::from_raw(0), &set).unwrap();
        let out = bench(&d, &path, &["rma", "-n", "2", "--sizes", "8"])
            .output()
            .unwrap();
        let mut all = CpuSet::new();
        for &c in &cpus {
            all.set(c).unwrap();
        }
        sched_setaffinity(Pid::from_raw(0), &all).unwrap();
        out
    };
    let out = run_on(1);
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains(WARNING)).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].starts_with("bench: warning: 2 PEs on 1 CPU cores")
            && warnings[0].contains("-n 1 or fewer"),
        "{err}"
    );
    if cpus.len() >= 2 {
        let out = run_on(2);
        assert!(out.status.success(), "{}", text(&out));
        assert!(!text(&out).contains(WARNING), "{}", text(&out));
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Process ids of live (not zombie) processes whose command line contains `needle`.
fn processes_naming(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmdline).contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// Waits (up to `limit`) until `f` holds.
fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

fn sigterm(child: &Child) {
    nix::sys::signal::kill(
        Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

/// Runs the default sweep with an mpicc that never ends (so the benchmark cannot finish on its
/// own) and sends SIGTERM once `ready` holds for the benchmark's scratch folder.
fn stopped_bench(name: &str, ready: impl Fn(&Path, &Path) -> bool) {
    let d = folder(name);
    let bin = d.join("bin");
    let marker = d.join("mpicc-pid");
    common::fake_program(
        &bin,
        "mpicc",
        &format!(
            "echo $$ > {}.tmp && mv {0}.tmp {0}\nexec sleep 120",
            marker.display()
        ),
    );
    let mut child = bench(&d, &path_with(&bin), &["-n", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let scratch = d.join(format!("symheap-bench-{}", child.id()));
    assert!(
        wait_until(Duration::from_secs(60), || ready(&scratch, &marker)),
        "{name}: the benchmark never got there"
    );
    assert!(child.try_wait().unwrap().is_none(), "{name}: ended early");
    let t0 = Instant::now();
    sigterm(&child);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 15), "{name}: {err}");
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "{name}: took {:?}",
        t0.elapsed()
    );
    assert!(err.contains("interrupted by SIGTERM"), "{name}: {err}");
    assert_eq!(scratch_folders(&d), Vec::<PathBuf>::new(), "{name}: {err}");
    // Nothing the benchmark started is left: the PEs name the scratch folder in their
    // arguments; the fake mpicc wrote its process id.
    let needle = scratch.display().to_string();
    assert!(
        wait_until(Duration::from_secs(10), || processes_naming(&needle)
            .is_empty()),
        "{name}: left running: {:?}",
        processes_naming(&needle)
    );
    if let Ok(pid) = std::fs::read_to_string(&marker) {
        let pid = pid.trim();
        assert!(
            wait_until(Duration::from_secs(10), || {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
                stat.map_or(true, |s| {
                    s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'))
                })
            }),
            "{name}: mpicc {pid} left running"
        );
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_bench_stopped_while_its_pes_run_leaves_nothing_behind() {
    // The PEs write their results into the folder at the very end: a folder with no results
    // yet and a PE naming it means the PEs are running.
    stopped_bench("pes", |scratch, _| {
        !processes_naming(&format!("{}/host.json", scratch.display())).is_empty()
            && !scratch.join("host.json").exists()
    });
}

#[test]
fn a_bench_stopped_while_mpicc_runs_leaves_nothing_behind() {
    stopped_bench("mpicc", |_, marker| marker.exists());
}

#[test]
fn open_mpi_without_its_headers_costs_the_mpi_column_only() {
    let d = folder("mpih");
    let bin = d.join("bin");
    let include = d.join("include");
    std::fs::create_dir_all(&include).unwrap();
    // mpicc as Debian's openmpi-bin installs it without libopenmpi-dev: it names an include
    // folder that has no mpi.h, and compiling would fail with the compiler's raw message.
    common::fake_program(
        &bin,
        "mpicc",
        &format!(
            "case \"$1\" in\n--showme:compile) echo '-I{} -pthread' ;;\n*) echo 'mpi_peer.c:9:10: \
             fatal error: mpi.h: No such file or directory' >&2; exit 1 ;;\nesac",
            include.display()
        ),
    );
    let args = ["coll", "-n", "2", "--op", "all_reduce", "--sizes", "8,64"];
    let out = bench(&d, &path_with(&bin), &args).output().unwrap();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("no Open MPI peer"))
        .unwrap_or_else(|| panic!("no reason given: {all}"));
    assert!(
        line.contains(&format!("no mpi.h in {}", include.display()))
            && line.contains("libopenmpi-dev"),
        "{line}"
    );
    assert!(
        !all.contains("fatal error"),
        "the compiler's raw error: {all}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("| all_reduce f32 sum"))
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(rows.iter().all(|r| r.contains("not available")), "{stdout}");
    // No mpicc at all: the same column missing, the same hint.
    let empty = d.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = bench(&d, empty.to_str().unwrap(), &args).output().unwrap();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("no Open MPI peer in this table: mpicc not found")
            && all.contains("libopenmpi-dev"),
        "{all}"
    );
    assert_eq!(scratch_folders(&d), Vec::<PathBuf>::new());
    std::fs::remove_dir_all(&d).unwrap();
}
