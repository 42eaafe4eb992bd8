//! How the PEs of a launch ended, and the one-line summary the launcher prints about it.

use std::fmt;

use nix::sys::signal::Signal;

/// How one PE's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeEnd {
    /// It exited with this status.
    Exited(i32),
    /// It was killed by this signal (not sent by the launcher's own stopping of the job; a
    /// forwarded SIGINT/SIGTERM counts as the PE's own end).
    Signaled(i32),
    /// It was still running when the launcher stopped the job, and ended after the launcher's
    /// SIGTERM or SIGKILL.
    StoppedByLauncher,
    /// It ended but its status could not be collected (something else in this process reaped
    /// it, e.g. SIGCHLD is ignored). Counted as a failure.
    Lost,
}

impl PeEnd {
    /// True for a zero exit status.
    pub fn success(&self) -> bool {
        *self == PeEnd::Exited(0)
    }

    /// The status a shell would report for a process that ended like this.
    fn shell_status(&self) -> i32 {
        match *self {
            PeEnd::Exited(c) => c,
            PeEnd::Signaled(s) => 128 + s,
            PeEnd::StoppedByLauncher | PeEnd::Lost => 1,
        }
    }

    /// The predicate of a sentence about one PE (`plural` for several).
    pub(crate) fn describe(&self, plural: bool) -> String {
        let was = if plural { "were" } else { "was" };
        match *self {
            PeEnd::Exited(c) => format!("exited with status {c}"),
            PeEnd::Signaled(s) => format!("{was} killed by {}", signal_desc(s)),
            PeEnd::StoppedByLauncher => format!("{was} stopped by the launcher"),
            PeEnd::Lost => "ended with an unknown status".to_string(),
        }
    }
}

impl fmt::Display for PeEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(false))
    }
}

/// How a launch went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOutcome {
    /// How each PE ended, indexed by rank.
    pub ends: Vec<PeEnd>,
    /// The PE that failed first, while the job was still running normally, and how.
    pub first_failure: Option<(usize, PeEnd)>,
    /// The signal (SIGINT or SIGTERM) the launcher received and forwarded to the PEs, if any.
    pub interrupted: Option<i32>,
}

impl LaunchOutcome {
    /// True when every PE exited with status 0 and the launcher was not interrupted.
    pub fn success(&self) -> bool {
        self.first_failure.is_none()
            && self.interrupted.is_none()
            && self.ends.iter().all(PeEnd::success)
    }

    /// The launcher's exit status, following what ended the job first: the first failure's status
    /// (128+signo if it was killed by a signal), else 128+signo of a forwarded interrupt, else 0.
    pub fn exit_code(&self) -> i32 {
        // first_failure is only recorded before the launcher starts stopping the job, so when both
        // are set the failure came first.
        if let Some((_, end)) = self.first_failure {
            end.shell_status()
        } else if let Some(sig) = self.interrupted {
            128 + sig
        } else if self.ends.iter().all(PeEnd::success) {
            0
        } else {
            1
        }
    }

    /// One line: what ended the job, then how the PEs ended, grouped. For example `PE 3 was
    /// killed by signal 9 (SIGKILL); PEs 0-2 exited with status 1`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some((pe, end)) = self.first_failure {
            parts.push(format!("PE {pe} {}", end.describe(false)));
        }
        if let Some(sig) = self.interrupted {
            let first = if parts.is_empty() { "" } else { "then " };
            parts.push(format!(
                "{first}interrupted by {} and forwarded it to the PEs",
                signal_name(sig)
            ));
        }
        if parts.is_empty() && self.ends.len() > 1 && self.ends.iter().all(PeEnd::success) {
            return format!("all {} PEs exited with status 0", self.ends.len());
        }
        // Group the rest by how they ended, in order of the lowest PE of each group.
        let mut groups: Vec<(PeEnd, Vec<usize>)> = Vec::new();
        for (pe, end) in self.ends.iter().enumerate() {
            if self.first_failure.map(|(f, _)| f) == Some(pe) {
                continue;
            }
            match groups.iter_mut().find(|(e, _)| e == end) {
                Some((_, pes)) => pes.push(pe),
                None => groups.push((*end, vec![pe])),
            }
        }
        for (end, pes) in groups {
            parts.push(format!("{} {}", pe_list(&pes), end.describe(pes.len() > 1)));
        }
        parts.join("; ")
    }
}

/// `SIGKILL`, or the number for signals without a name.
pub(crate) fn signal_name(sig: i32) -> String {
    match Signal::try_from(sig) {
        Ok(s) => s.as_str().to_string(),
        Err(_) => format!("signal {sig}"),
    }
}

/// `signal 9 (SIGKILL)`.
fn signal_desc(sig: i32) -> String {
    match Signal::try_from(sig) {
        Ok(s) => format!("signal {sig} ({})", s.as_str()),
        Err(_) => format!("signal {sig}"),
    }
}

/// `PE 3`, or `PEs 0-2, 5, 7` with runs of three or more shortened, which keeps the summary of a
/// large job on one readable line.
fn pe_list(pes: &[usize]) -> String {
    if let [pe] = pes {
        return format!("PE {pe}");
    }
    let mut items = Vec::new();
    let mut i = 0;
    while i < pes.len() {
        let mut j = i;
        while j + 1 < pes.len() && pes[j + 1] == pes[j] + 1 {
            j += 1;
        }
        if j - i >= 2 {
            items.push(format!("{}-{}", pes[i], pes[j]));
        } else {
            items.extend(pes[i..=j].iter().map(|p| p.to_string()));
        }
        i = j + 1;
    }
    format!("PEs {}", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pe_lists_shorten_runs() {
        assert_eq!(pe_list(&[3]), "PE 3");
        assert_eq!(pe_list(&[0, 1]), "PEs 0, 1");
        assert_eq!(pe_list(&[0, 1, 2, 5, 7, 8, 9, 10]), "PEs 0-2, 5, 7-10");
        assert_eq!(signal_desc(11), "signal 11 (SIGSEGV)");
        assert_eq!(signal_desc(77), "signal 77");
    }
}
