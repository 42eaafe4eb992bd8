//! `symheap bench` on the host backend does what its arguments say, or refuses them with a
//! message and a non-zero status before starting anything.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const SYMHEAP: &str = env!("CARGO_BIN_EXE_symheap");

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("symheap-bench-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn bench(args: &[&str], path_var: Option<&Path>) -> (Output, Duration) {
    let mut cmd = Command::new(SYMHEAP);
    cmd.arg("bench").arg("--host").args(args);
    cmd.env("SYMHEAP_HEAP_CAPACITY", "1G")
        .env("SYMHEAP_TIMEOUT", "60");
    if let Some(p) = path_var {
        cmd.env("PATH", p);
    }
    let t0 = Instant::now();
    let out = cmd.output().expect("run symheap bench");
    (out, t0.elapsed())
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn host_sweep_runs_the_collectives_sizes_and_dtype_asked_for() {
    let d = scratch("coll");
    let json = d.join("rows.json");
    let (out, _) = bench(
        &[
            "coll",
            "-n",
            "2",
            "--op",
            "all_gather,reduce_scatter",
            "--sizes",
            "4K,64K",
            "--dtype",
            "bf16",
            "--json",
            json.to_str().unwrap(),
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows: Vec<(String, u64)> = doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["op"].as_str().unwrap().to_string(),
                r["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = ["all_gather bf16", "reduce_scatter bf16 sum"]
        .iter()
        .flat_map(|op| [(op.to_string(), 4096), (op.to_string(), 65536)])
        .collect();
    assert_eq!(rows, want, "{}", text(&out));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn host_sweep_refuses_what_it_cannot_honour() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["rma", "--op", "all_reduce"],
            "--op and --dtype choose collectives, and `bench rma` runs none",
        ),
        (
            &["--peer-json", "peers.json"],
            "--peer-json merges peers measured next to a GPU sweep",
        ),
        (
            &["coll", "--op", "allreduce"],
            "unknown collective \"allreduce\"",
        ),
        (&["coll", "--dtype", "complex"], "unknown dtype \"complex\""),
        (&["coll", "--sizes", "lots"], "\"lots\" is not a size"),
        (
            &["coll", "-n", "2", "--op", "alltoall", "--sizes", "1002"],
            "alltoall of 1002 bytes on 2 PEs: the size must be a multiple of 8 bytes",
        ),
        (&["everything"], "unknown sweep \"everything\""),
    ];
    for (args, msg) in cases {
        let (out, took) = bench(args, None);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {all}");
        assert!(all.contains(msg), "{args:?}: {all}");
        assert!(out.stdout.is_empty(), "{args:?} printed a table: {all}");
        assert!(took < Duration::from_secs(5), "{args:?} took {took:?}");
    }
}

#[test]
fn a_chart_that_cannot_be_drawn_is_refused_before_the_sweep() {
    let d = scratch("png");
    let png = d.join("chart.png");
    let png = png.to_str().unwrap();
    let args = [
        "coll",
        "-n",
        "2",
        "--op",
        "all_gather",
        "--sizes",
        "4K",
        "--png",
        png,
    ];
    // No python3 at all.
    let empty = d.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (out, took) = bench(&args, Some(&empty));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "bench: cannot draw {png}: python3 is not on PATH (charts need python3 with matplotlib)"
        )),
        "{}",
        text(&out)
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // A python3 without matplotlib: a bare virtual environment.
    let venv = d.join("bare");
    let made = Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .expect("python3 -m venv (Python 3 with venv is needed to run the tests)");
    assert!(made.success());
    let (out, _) = bench(&args, Some(&venv.join("bin")));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out)
            .contains("python3 has no matplotlib (install it: python3 -m pip install matplotlib)"),
        "{}",
        text(&out)
    );
    assert!(!Path::new(png).exists());
    std::fs::remove_dir_all(&d).unwrap();
}
