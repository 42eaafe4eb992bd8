//! Open MPI as the host sweep's peer: the peer program (`mpi_peer.c`) compiled with `mpicc`
//! on the spot and run with `mpirun`, its times merged into symheap's rows. When Open MPI or
//! its headers are missing, the sweep goes on without the MPI column and says why and what to
//! install, checked before compiling (a missing `mpi.h` used to come out as mpicc's raw error).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{scratch, Row};

/// What to install for the MPI column, on the two families of distributions.
const INSTALL_HINT: &str = "install Open MPI with its headers: apt-get install openmpi-bin \
                            libopenmpi-dev (Debian/Ubuntu) or dnf install openmpi-devel \
                            (Fedora/RHEL)";

/// The folders searched for headers in `flags` (compiler flags: `-I DIR`, `-IDIR`, `-isystem
/// DIR`).
fn include_dirs(flags: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut words = flags.split_whitespace();
    while let Some(w) = words.next() {
        let dir = match w {
            "-I" | "-isystem" => words.next(),
            _ => w.strip_prefix("-I"),
        };
        out.extend(dir.filter(|d| !d.is_empty()).map(PathBuf::from));
    }
    out
}

/// Where `mpicc` takes `mpi.h` from: the `-I` folders it adds (Open MPI's `--showme:compile`,
/// else MPICH's `-show`), else the compiler's own `/usr/include` and `/usr/local/include`.
/// `Ok(None)` when mpicc says neither (then compiling is the only test).
fn mpicc_include_dirs() -> Result<Option<(Vec<PathBuf>, &'static str)>, String> {
    for ask in ["--showme:compile", "-show"] {
        match scratch::output(Command::new("mpicc").arg(ask)) {
            Ok(o) if o.status.success() => {
                let mut dirs = include_dirs(&String::from_utf8_lossy(&o.stdout));
                if dirs.is_empty() {
                    dirs = vec!["/usr/include".into(), "/usr/local/include".into()];
                }
                return Ok(Some((dirs, ask)));
            }
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!("mpicc not found; {INSTALL_HINT}"));
            }
            Err(e) => return Err(format!("cannot run mpicc: {e}")),
        }
    }
    Ok(None)
}

/// Compiles the MPI peer with mpicc into `dir`, or says why it cannot: no mpicc, no `mpi.h`
/// where mpicc looks (checked first), or the compiler's first lines.
fn build_peer(dir: &Path) -> Result<PathBuf, String> {
    if let Some((dirs, ask)) = mpicc_include_dirs()? {
        if !dirs.iter().any(|d| d.join("mpi.h").is_file()) {
            let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
            return Err(format!(
                "mpicc is installed but Open MPI's headers are not (no mpi.h in {}, the folders \
                 `mpicc {ask}` names); {INSTALL_HINT}",
                shown.join(", ")
            ));
        }
    }
    let src = dir.join("mpi_peer.c");
    let exe = dir.join("mpi_peer");
    std::fs::write(&src, include_str!("mpi_peer.c"))
        .map_err(|e| format!("cannot write {}: {e}", src.display()))?;
    let mut cmd = Command::new("mpicc");
    cmd.arg("-O2").arg("-o").arg(&exe).arg(&src);
    match scratch::output(&mut cmd) {
        Ok(o) if o.status.success() => Ok(exe),
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let first: Vec<&str> = err.lines().take(3).collect();
            Err(format!(
                "mpicc could not compile the MPI peer ({}): {}; {INSTALL_HINT}",
                o.status,
                first.join(" / ")
            ))
        }
        Err(e) => Err(format!("cannot run mpicc: {e}")),
    }
}

/// What the MPI peer measured: seconds per barrier, and per size the seconds of an all_reduce,
/// a broadcast, a one-sided put and a get.
#[derive(Debug, Default)]
pub(super) struct MpiTimes {
    pub(super) barrier: Option<f64>,
    pub(super) allreduce: Vec<(u64, f64)>,
    pub(super) bcast: Vec<(u64, f64)>,
    pub(super) put: Vec<(u64, f64)>,
    pub(super) get: Vec<(u64, f64)>,
}

/// The message sizes the MPI peer runs: all_reduce, broadcast, put/get.
#[derive(Debug, Default)]
pub(super) struct MpiSizes {
    pub(super) ar: Vec<u64>,
    pub(super) bc: Vec<u64>,
    pub(super) rma: Vec<u64>,
}

/// Runs the MPI peer at `n` ranks over the sizes of `sz`.
fn run_peer(exe: &Path, n: usize, sz: &MpiSizes) -> Result<MpiTimes, String> {
    let mut cmd = Command::new("mpirun");
    cmd.arg("-n").arg(n.to_string()).arg("--oversubscribe");
    if nix::unistd::getuid().is_root() {
        cmd.arg("--allow-run-as-root");
    }
    cmd.arg(exe);
    cmd.args(sz.ar.iter().map(|s| format!("ar:{s}")));
    cmd.args(sz.bc.iter().map(|s| format!("bc:{s}")));
    cmd.args(sz.rma.iter().map(|s| format!("rma:{s}")));
    let out = match scratch::output(&mut cmd) {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            return Err(format!(
                "mpirun failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
        Err(e) => return Err(format!("cannot run mpirun: {e}")),
    };
    let mut t = MpiTimes::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let sized = |b: &str, s: &str| Some((b.parse().ok()?, s.parse().ok()?));
        match f.as_slice() {
            ["barrier", s] => t.barrier = s.parse().ok(),
            ["allreduce", b, s] => t.allreduce.extend(sized(b, s)),
            ["bcast", b, s] => t.bcast.extend(sized(b, s)),
            ["put", b, s] => t.put.extend(sized(b, s)),
            ["get", b, s] => t.get.extend(sized(b, s)),
            _ => {}
        }
    }
    Ok(t)
}

/// The MPI peer's times at `n` ranks over `sz`, compiled in `dir`; or why there are none.
pub(super) fn times(dir: &Path, n: usize, sz: &MpiSizes) -> Result<MpiTimes, String> {
    run_peer(&build_peer(dir)?, n, sz)
}

/// The peer of the one-sided rows Open MPI adds next to the memcpy ones.
const MPI_RMA_PEER: &str = "Open MPI MPI_Put/MPI_Get + MPI_Win_flush, shared-memory window";

/// The peer of the broadcast rows.
pub(crate) const MPI_BCAST_PEER: &str = "Open MPI MPI_Bcast";

/// Whether `op` is a broadcast row (any dtype: MPI broadcasts the same bytes).
pub(super) fn is_broadcast(op: &str) -> bool {
    op.split(' ').next() == Some("broadcast")
}

/// `rows` with the MPI peer's times filled in (barrier, f32 all_reduce, broadcast), and after
/// each put and get row a second one with the same symheap time against MPI's one-sided call.
pub(super) fn with_mpi_times(rows: Vec<Row>, t: &MpiTimes, f32_label: &str) -> Vec<Row> {
    let at = |v: &[(u64, f64)], b: u64| v.iter().find(|(x, _)| *x == b).map(|&(_, s)| s);
    let mut out = Vec::with_capacity(rows.len() * 2);
    for mut r in rows {
        if r.op == "barrier" {
            r.peer_s = t.barrier;
        }
        if r.op == f32_label {
            r.peer_s = at(&t.allreduce, r.bytes);
        }
        if is_broadcast(&r.op) {
            r.peer_s = at(&t.bcast, r.bytes);
        }
        let one_sided = match r.op.split(' ').next() {
            Some("put") => at(&t.put, r.bytes),
            Some("get") => at(&t.get, r.bytes),
            _ => None,
        };
        let twin = one_sided.map(|s| Row {
            op: r.op.clone(),
            bytes: r.bytes,
            symheap_s: r.symheap_s,
            peer: MPI_RMA_PEER.into(),
            peer_s: Some(s),
        });
        out.push(r);
        out.extend(twin);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(op: &str, bytes: u64, peer: &str) -> Row {
        Row {
            op: op.into(),
            bytes,
            symheap_s: 1e-6,
            peer: peer.into(),
            peer_s: None,
        }
    }

    #[test]
    fn include_dirs_read_every_form_of_the_flag() {
        let got = include_dirs("-I/a/include -I /b -isystem /c -pthread -DX=1 -I");
        let want: Vec<PathBuf> = ["/a/include", "/b", "/c"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(got, want);
        assert!(include_dirs("-pthread").is_empty());
    }

    #[test]
    fn mpi_times_fill_their_rows_and_one_sided_ones_follow_each_put_and_get() {
        let rows = vec![
            row("put (PE 0 -> PE 1)", 4096, "memcpy, same process"),
            row("get (PE 0 <- PE 1)", 4096, "memcpy, same process"),
            row("put (PE 0 -> PE 1)", 65536, "memcpy, same process"),
            row("barrier", 0, "Open MPI MPI_Barrier"),
            row("all_reduce f32 sum", 1024, "Open MPI MPI_Allreduce"),
        ];
        let t = MpiTimes {
            barrier: Some(2e-6),
            allreduce: vec![(1024, 3e-6)],
            bcast: vec![],
            put: vec![(4096, 4e-6)],
            get: vec![(4096, 5e-6)],
        };
        let out = with_mpi_times(rows, &t, "all_reduce f32 sum");
        let got: Vec<(&str, u64, &str, Option<f64>)> = out
            .iter()
            .map(|r| (r.op.as_str(), r.bytes, r.peer.as_str(), r.peer_s))
            .collect();
        let memcpy = "memcpy, same process";
        assert_eq!(
            got,
            vec![
                ("put (PE 0 -> PE 1)", 4096, memcpy, None),
                ("put (PE 0 -> PE 1)", 4096, MPI_RMA_PEER, Some(4e-6)),
                ("get (PE 0 <- PE 1)", 4096, memcpy, None),
                ("get (PE 0 <- PE 1)", 4096, MPI_RMA_PEER, Some(5e-6)),
                // No MPI time at this size: no twin row.
                ("put (PE 0 -> PE 1)", 65536, memcpy, None),
                ("barrier", 0, "Open MPI MPI_Barrier", Some(2e-6)),
                (
                    "all_reduce f32 sum",
                    1024,
                    "Open MPI MPI_Allreduce",
                    Some(3e-6)
                ),
            ]
        );
        assert!(out.iter().all(|r| r.symheap_s == 1e-6));
    }

    #[test]
    fn broadcast_rows_get_mpi_bcast_at_their_size_whatever_the_dtype() {
        let rows = vec![
            row("broadcast f32", 8, MPI_BCAST_PEER),
            row("broadcast bf16", 4096, MPI_BCAST_PEER),
            row("broadcast f32", 65536, MPI_BCAST_PEER),
            row("all_gather f32", 8, "none on the host backend"),
        ];
        let t = MpiTimes {
            bcast: vec![(8, 7e-7), (4096, 9e-7)],
            allreduce: vec![(8, 1e-5)],
            ..Default::default()
        };
        let got: Vec<Option<f64>> = with_mpi_times(rows, &t, "all_reduce f32 sum")
            .iter()
            .map(|r| r.peer_s)
            .collect();
        assert_eq!(got, vec![Some(7e-7), Some(9e-7), None, None]);
    }
}
