//! Judging a finished self-test run from the launcher's status and the PEs' output lines.

use std::time::Duration;

use super::{Expect, Scenario, PASS, SKIP};

/// What is wrong with a finished run of `s` against what it must show: the launcher's status
/// and, on stdout, exactly one PASS line from each PE that must pass. Empty when nothing is.
pub(super) fn case_problems(
    s: &Scenario,
    n: usize,
    victim: usize,
    status: Option<std::process::ExitStatus>,
    limit: Duration,
    stdout: &str,
    stderr: &str,
) -> Vec<String> {
    let mut problems = Vec::new();
    let passed: Vec<usize> = (0..n)
        .filter(|r| {
            stdout
                .lines()
                .filter(|l| {
                    l.starts_with(&format!("[PE {r}] "))
                        && l.contains(&format!("{PASS} {} PE {r}", s.name))
                })
                .count()
                == 1
        })
        .collect();
    match (s.expect, status.as_ref().and_then(|s| s.code())) {
        (_, None) if status.is_none() => problems.push(format!("hung for over {limit:?}")),
        (Expect::AllPass, Some(0)) => {}
        (Expect::AllPass, code) => {
            problems.push(format!("launcher exit code {code:?}, expected 0"))
        }
        (Expect::VictimKilled, Some(137)) => {
            if !stderr.contains(&format!("PE {victim}")) || !stderr.contains("SIGKILL") {
                problems.push("launcher summary does not name the killed PE and SIGKILL".into());
            }
        }
        (Expect::VictimKilled, code) => {
            problems.push(format!("launcher exit code {code:?}, expected 137"))
        }
    }
    let want: Vec<usize> = match s.expect {
        Expect::AllPass => (0..n).collect(),
        Expect::VictimKilled => (0..n).filter(|&r| r != victim).collect(),
    };
    if passed != want {
        problems.push(format!("PEs that passed: {passed:?}, expected {want:?}"));
    }
    if let Some(line) = released_late(stderr) {
        problems.push(format!(
            "a CUDA object was released after its context: {line}"
        ));
    }
    problems
}

/// What the self-test's GPU runs log (`SYMHEAP_LOG`): warnings, and the CUDA driver layer's
/// release calls that failed.
pub(super) const RELEASE_LOG: &str = "warn,symheap::backend::cuda::driver=debug";

/// The first log line of a CUDA release call (an event, module, pinned block or stream
/// destroyed at teardown) that the driver refused because the context had gone before the
/// object: the teardown order the backend keeps (its context retain dropped last) was broken,
/// which ends a process with SIGSEGV as often as with an error code.
pub(super) fn released_late(stderr: &str) -> Option<&str> {
    stderr.lines().find(|l| {
        l.contains(" at release: ")
            && [
                "CONTEXT_IS_DESTROYED",
                "INVALID_CONTEXT",
                "DEINITIALIZED",
                "INVALID_HANDLE",
            ]
            .iter()
            .any(|e| l.contains(e))
    })
}

/// The reason every PE of a run that exited 0 gave for skipping `s`, when each of the `n` PEs
/// gave one; a run where only some PEs skipped is judged as any other (and fails).
pub(super) fn all_skipped(
    s: &Scenario,
    n: usize,
    status: Option<std::process::ExitStatus>,
    stdout: &str,
) -> Option<String> {
    if status.and_then(|st| st.code()) != Some(0) {
        return None;
    }
    let mut why = None;
    for r in 0..n {
        let tag = format!("[PE {r}] {SKIP} {} PE {r}: ", s.name);
        let line = stdout.lines().find_map(|l| l.strip_prefix(tag.as_str()))?;
        why.get_or_insert_with(|| line.to_string());
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    #[test]
    fn a_release_after_the_context_is_named() {
        let late = "2026 DEBUG symheap::backend::cuda::driver: cuEventDestroy at release: CUDA_ERROR_CONTEXT_IS_DESTROYED";
        assert_eq!(released_late(&format!("x\n{late}\ny")), Some(late));
        let other = "DEBUG symheap::backend::cuda::driver: cuEventDestroy at release: CUDA_ERROR_ILLEGAL_ADDRESS";
        assert_eq!(released_late(other), None);
        assert_eq!(
            released_late("symheap launch: PE 1 exited with status 0"),
            None
        );
    }

    fn nccl() -> &'static Scenario {
        super::super::SCENARIOS
            .iter()
            .find(|s| s.name == "coll-nccl")
            .unwrap()
    }

    fn skip_line(r: usize) -> String {
        format!("[PE {r}] {SKIP} coll-nccl PE {r}: PE 1 shares its GPU with another PE\n")
    }

    #[test]
    fn a_run_is_skipped_only_when_every_pe_says_so_and_it_exited_0() {
        let ok = Some(ExitStatus::from_raw(0));
        let both = skip_line(0) + &skip_line(1);
        let why = all_skipped(nccl(), 2, ok, &both);
        assert_eq!(why.as_deref(), Some("PE 1 shares its GPU with another PE"));
        // One PE skipping while the other ran is a failure to judge, not a skip.
        let one = skip_line(0) + &format!("[PE 1] {PASS} coll-nccl PE 1\n");
        assert_eq!(all_skipped(nccl(), 2, ok, &one), None);
        assert!(!case_problems(nccl(), 2, 1, ok, Duration::from_secs(1), &one, "").is_empty());
        // A launcher that failed is never a skip, whatever the PEs printed.
        let failed = Some(ExitStatus::from_raw(1 << 8));
        assert_eq!(all_skipped(nccl(), 2, failed, &both), None);
        assert_eq!(all_skipped(nccl(), 2, None, &both), None);
    }
}
