//! Multi-process tests: every scenario of `symheap selftest` at 1, 2, 4 and 8 PEs, each run
//! under `symheap launch`, plus the repository's example under the launcher.

use std::process::Command;

const SYMHEAP: &str = env!("CARGO_BIN_EXE_symheap");

fn seed() -> u64 {
    std::env::var("SYMHEAP_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

fn selftest(scenario: &str) {
    selftest_at(scenario, "1,2,4,8");
}

/// `selftest` at the PE counts `pes` (comma-separated).
fn selftest_at(scenario: &str, pes: &str) {
    let seed = seed();
    let out = Command::new(SYMHEAP)
        .args(["selftest", "--pes", pes, "--only", scenario, "--seed"])
        .arg(seed.to_string())
        .output()
        .expect("run symheap selftest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "selftest {scenario} failed (seed {seed}; rerun with SYMHEAP_TEST_SEED={seed})\n{stdout}\n{stderr}"
    );
    // The runner must have run something: a scenario that ran zero cases is not a pass.
    assert!(stdout.contains("| pass |"), "no case ran:\n{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
}

/// The divergence property test: random programs of collective calls at 2, 3, 4 and 8 PEs, one
/// PE diverging at a random step in a random way (or none): every divergence named within 1 s
/// on every PE, every identical program exact. Twelve programs per PE count.
#[test]
fn random_divergences_are_named_fast_and_identical_programs_are_exact() {
    let base = seed();
    for k in 0..12u64 {
        let s = base.wrapping_add(k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let out = Command::new(SYMHEAP)
            .args([
                "selftest", "--pes", "2,3,4,8", "--only", "diverge", "--seed",
            ])
            .arg(s.to_string())
            .output()
            .expect("run symheap selftest");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("4 of 4 runs passed"),
            "seed {s} (rerun: symheap selftest --only diverge --pes 2,3,4,8 --seed {s})\n{stdout}\n{stderr}"
        );
    }
}

#[test]
fn contract_tables_offsets_translation_growth() {
    selftest("contract");
}

#[test]
fn release_reuse_no_leak() {
    selftest("release");
}

#[test]
fn alloc_release_churn_keeps_headroom() {
    selftest("alloc-churn");
}

#[test]
fn bad_input_and_out_of_memory() {
    selftest("bad-input");
}

#[test]
fn ledger_mismatch_fails_every_pe() {
    selftest("mismatch");
}

#[test]
fn sigkill_is_noticed_by_every_pe() {
    selftest("kill");
}

#[test]
fn timeout_names_the_late_pe() {
    selftest("timeout");
}

#[test]
fn provider_trait_contract_on_the_native_heap() {
    selftest("provider-native");
}

/// Runs the symheap crate's example `name` under the launcher at 4 PEs; every PE must print
/// `says` after its prefix.
fn run_example(name: &str, says: &str) {
    // The example is built by `cargo test` (examples are compiled with the tests) next to the
    // symheap binary's directory.
    let dir = std::path::Path::new(SYMHEAP).parent().unwrap();
    let example = dir.join("examples").join(name);
    if !example.exists() {
        let st = Command::new(env!("CARGO"))
            .args(["build", "-p", "symheap", "--example", name])
            .status()
            .unwrap();
        assert!(st.success());
    }
    let out = Command::new(SYMHEAP)
        .args(["launch", "-n", "4", "--"])
        .arg(&example)
        .env("SEED", seed().to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for pe in 0..4 {
        assert!(
            stdout.contains(&format!("[PE {pe}] PE {pe} of 4: {says}")),
            "{stdout}"
        );
    }
}

#[test]
fn example_writes_into_every_peer_under_the_launcher() {
    run_example("peer_write", "received");
}

#[test]
fn example_ring_on_a_stream_under_the_launcher() {
    run_example("stream_ring", "ring and all_reduce");
}

#[test]
fn launch_reports_a_failing_program() {
    let out = Command::new(SYMHEAP)
        .args([
            "launch",
            "-n",
            "2",
            "--grace",
            "0.2",
            "--",
            "/bin/sh",
            "-c",
            "exit $((RANK + 3))",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(3 | 4)),
        "{:?} {stderr}",
        out.status
    );
    assert!(stderr.contains("exited with status"), "{stderr}");
}

#[test]
fn malformed_coll_defines_fail_init_clearly() {
    // Only SYMHEAP_COLL_* names with size values reach the kernel source; anything else is
    // refused at init, naming the variable, on the host backend too.
    for bad in [
        "SYMHEAP_COLL_LL_MAX=lots",
        "LL_MAX=4",
        "SYMHEAP_COLL_X=1;int y",
    ] {
        let out = Command::new(SYMHEAP)
            .env("SYMHEAP_COLL_DEFINES", bad)
            .env("SYMHEAP_BACKEND", "host")
            .arg("info")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{bad}: {text}");
        assert!(text.contains("SYMHEAP_COLL_DEFINES"), "{bad}: {text}");
    }
    let out = Command::new(SYMHEAP)
        .env("SYMHEAP_COLL_DEFINES", "SYMHEAP_COLL_LL_MAX=128K")
        .env("SYMHEAP_BACKEND", "host")
        .arg("info")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn info_prints_the_banner() {
    let out = Command::new(SYMHEAP)
        .args(["info", "--vars"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    for needle in [
        "symheap 0.",
        "backend",
        "heap",
        "capacity",
        "SYMHEAP_TIMEOUT",
    ] {
        assert!(stdout.contains(needle), "missing {needle}: {stdout}");
    }
    let out = Command::new(SYMHEAP)
        .env("SYMHEAP_DEBUG", "info")
        .args([
            "launch",
            "-n",
            "2",
            "--",
            SYMHEAP,
            "selftest-pe",
            "contract",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success());
    assert!(
        stderr.contains("[PE 1] symheap 0."),
        "banner at init: {stderr}"
    );
}

#[test]
fn ring_put_and_get() {
    selftest("ring");
}

#[test]
fn alltoall_patterns() {
    selftest("alltoall");
}

/// The uneven alltoall (split sizes on the host, counts in symmetric memory; host and stream
/// forms) on random splits with zeros, exact, at 1, 2, 3, 4 and 8 PEs; disagreeing sizes and a
/// negative count refused on every PE.
#[test]
fn uneven_alltoall_is_exact_and_refuses_disagreements() {
    selftest_at("alltoallv", "1,2,3,4,8");
}

#[test]
fn broadcast_from_every_root_and_all_gather() {
    selftest("broadcast");
}

#[test]
fn eager_broadcasts_stay_exact_past_the_slot_limit() {
    selftest("eager");
}

#[test]
fn two_eager_roots_are_named_on_every_pe_at_finalize() {
    selftest("eager-diverge");
}

#[test]
fn all_reduce_and_reduce_scatter_against_reference() {
    selftest("all-reduce");
}

#[test]
fn in_place_collectives_are_exact_and_other_overlaps_refused() {
    selftest("coll-alias");
}

#[test]
fn atomics_counter_and_matrix() {
    selftest("atomics");
}

#[test]
fn compare_swap_lock() {
    selftest("lock");
}

#[test]
fn put_signal_producer_consumer() {
    selftest("signal");
}

#[test]
fn a_quiet_after_puts_wakes_a_sleeping_waiter() {
    selftest("put-wake");
}

#[test]
fn teams_split_translate_collectives_destroy() {
    selftest("teams");
}

#[test]
fn teams_of_any_ranks_in_any_order() {
    selftest("teams-any");
}

#[test]
fn a_split_by_different_lists_is_named_on_every_pe() {
    selftest_at("team-ranks-mismatch", "2,4,8");
}

#[test]
fn teams_made_by_their_members_alone() {
    selftest("team-from-ranks");
}

#[test]
fn teams_made_by_their_members_alone_refuse_bad_lists_and_exchanges() {
    selftest_at("team-from-ranks-errors", "2,4,8");
}

#[test]
fn a_deadlock_on_a_team_of_any_order_names_its_members() {
    selftest_at("team-from-ranks-deadlock", "2,4,8");
}

#[test]
fn collective_argument_errors_and_divergence() {
    selftest("coll-errors");
}

#[test]
fn sub_team_divergence_is_named() {
    selftest("team-mismatch");
}

#[test]
fn stream_put_and_get_with_each_engine() {
    selftest("stream-ring");
}

#[test]
fn stream_copies_refuse_local_ranges_they_may_not_touch() {
    selftest("local-ranges");
}

#[test]
fn stream_put_signal_producer_consumer() {
    selftest("stream-signal");
}

#[test]
fn stream_barrier_orders_puts() {
    selftest("stream-barrier");
}

#[test]
fn stream_collectives_against_reference() {
    selftest("coll-stream");
}

/// Programs run unchanged under Open MPI's mpirun (rank, size and a rendezvous derived from
/// the job id come from OMPI_COMM_WORLD_*). scripts/test.sh installs Open MPI.
#[test]
fn launched_by_mpirun_unchanged() {
    let Ok(probe) = Command::new("mpirun").arg("--version").output() else {
        panic!("mpirun not found: install Open MPI (scripts/test.sh does: apt-get install openmpi-bin)");
    };
    assert!(probe.status.success());
    for scenario in ["contract", "ring", "teams"] {
        let mut cmd = Command::new("mpirun");
        cmd.args(["--oversubscribe", "-n", "2"]);
        if running_as_root() {
            cmd.arg("--allow-run-as-root");
        }
        let out = cmd
            .arg(SYMHEAP)
            .args(["selftest-pe", scenario, "--seed"])
            .arg(seed().to_string())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{scenario} under mpirun: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for pe in 0..2 {
            assert!(
                stdout.contains(&format!("SELFTEST-PASS {scenario} PE {pe}")),
                "{stdout}"
            );
        }
    }
}

/// Host collectives across nodes run through Open MPI: under mpirun with every PE its own
/// simulated node (SYMHEAP_NODE_ID per rank: no shared memory between PEs at all), and with 2
/// nodes of 2 PEs, the all_reduce/reduce_scatter, broadcast/all_gather, alltoall and uneven
/// alltoall (MPI_Alltoallv) scenarios are exact against their references (every dtype and op,
/// in and out of place), and so are
/// splits of the world across the nodes (`teams-nodes`: the world as a team, the PEs with
/// each node index; a divergence among their members named on each).
#[test]
fn host_collectives_across_simulated_nodes_run_through_open_mpi() {
    for (n, node) in [
        (2, "n$OMPI_COMM_WORLD_RANK"),
        (4, "n$((OMPI_COMM_WORLD_RANK / 2))"),
    ] {
        for scenario in [
            "all-reduce",
            "broadcast",
            "alltoall",
            "alltoallv",
            "teams-nodes",
        ] {
            let mut cmd = Command::new("mpirun");
            cmd.args(["--oversubscribe", "-n", &n.to_string()]);
            if running_as_root() {
                cmd.arg("--allow-run-as-root");
            }
            let line = format!(
                "SYMHEAP_NODE_ID={node} exec {} selftest-pe {scenario} --seed {}",
                SYMHEAP,
                seed()
            );
            let out = cmd
                .env("SYMHEAP_TIMEOUT", "60")
                .args(["sh", "-c", &line])
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{scenario} at {n} PEs across nodes: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            for pe in 0..n {
                assert!(
                    stdout.contains(&format!("SELFTEST-PASS {scenario} PE {pe}")),
                    "{stdout}"
                );
            }
        }
    }
}

/// Without mpirun, a host collective over PEs on different nodes fails on every PE with an
/// error saying what to do (launch with Open MPI's mpirun), instead of hanging or moving data
/// over a path of symheap's own.
#[test]
fn host_collectives_across_nodes_without_mpirun_say_what_is_needed() {
    let out = Command::new(SYMHEAP)
        .args(["launch", "-n", "2", "--", "sh", "-c"])
        .arg(format!(
            "SYMHEAP_NODE_ID=x$RANK exec {SYMHEAP} selftest-pe all-reduce --seed 1"
        ))
        .env("SYMHEAP_TIMEOUT", "30")
        .output()
        .unwrap();
    let stdout = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{stdout}");
    for pe in 0..2 {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!("SELFTEST-FAIL all-reduce PE {pe}")))
            .unwrap_or_else(|| panic!("PE {pe} did not fail: {stdout}"));
        assert!(
            line.contains("run through Open MPI")
                && line.contains("launch the job with Open MPI's mpirun"),
            "{line}"
        );
    }
}

/// mpirun refuses root unless told; CI runs as root.
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

#[test]
fn stream_collectives_take_local_buffers_only_where_the_kernel_stays_local() {
    selftest("coll-local");
}

/// A world across simulated nodes (`symheap launch --simulate-nodes 2`) on the host backend:
/// teams inside a node run their collectives; without mpirun a team across nodes is refused on
/// every PE, saying to launch with Open MPI's mpirun (the split used to panic reaching shared
/// memory of another node); a put to another node fails clearly. The GPU suite runs the same
/// scenarios on CUDA with every collective across nodes and teams across nodes through NCCL;
/// `host_collectives_across_simulated_nodes_run_through_open_mpi` runs them under mpirun.
#[test]
fn teams_inside_simulated_nodes_work_and_across_them_are_refused() {
    selftest("coll-nodes");
    selftest("teams-nodes");
}
