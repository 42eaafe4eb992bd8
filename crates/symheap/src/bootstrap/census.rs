//! The twin check: is another process on this node the same PE of a job with the same
//! identity? Then two jobs would meet at one rendezvous.
//!
//! Two jobs whose PEs have identical launch environments (started by hand, with the same
//! MASTER_PORT and no SYMHEAP_TOKEN) cannot be told apart by any protocol: PE 0 of one and PE 1
//! of the other, meeting first, look exactly like a job. The rendezvous catches the second job
//! wherever the two overlap there (`accept.rs`), but a pair that runs a whole job before the
//! other two PEs arrive would go unnoticed. What does tell them apart is that both jobs' PEs
//! exist as processes at once: a twin is a process of this user, of the same executable, whose
//! environment (as it was at exec, `/proc/PID/environ`) makes it the same rank of a job with the
//! same identity, and which is not of this PE's own family (its ancestors with that environment
//! and their descendants: a wrapper script, worker processes of this PE).
//!
//! Processes of other users, in other PID namespaces or on other nodes are not seen; the
//! rendezvous is what catches those.

use std::collections::{HashMap, HashSet};

use super::env::Launch;
use super::LaunchEnv;

/// A process that is this PE's twin.
pub(super) struct Twin {
    pub(super) pid: i32,
    pub(super) cmdline: String,
}

/// The variables of a process's environment at exec (empty when unreadable).
fn environ(pid: i32) -> HashMap<String, String> {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return HashMap::new();
    };
    raw.split(|&b| b == 0)
        .filter_map(|kv| {
            let kv = std::str::from_utf8(kv).ok()?;
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

/// Field `n` (1-based, as in proc(5)) of `/proc/PID/stat`, from field 3 on.
fn stat_field(pid: i32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name in parentheses may hold spaces: the fields after it are fixed.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(n - 3).map(str::to_string)
}

fn parent(pid: i32) -> Option<i32> {
    stat_field(pid, 4)?.parse().ok()
}

/// A process's pid and start time: unique on this node while it runs, and after.
fn tag(pid: i32) -> Option<String> {
    Some(format!("{pid}:{}", stat_field(pid, 22)?))
}

/// `pid` and its ancestors, nearest first.
fn lineage(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    let mut p = pid;
    while let Some(pp) = parent(p).filter(|&pp| pp > 0 && !out.contains(&pp)) {
        out.push(pp);
        p = pp;
    }
    out
}

type Key = (usize, String, Option<String>, bool);

fn key_of(vars: &mut HashMap<String, String>) -> Option<Key> {
    let l = Launch::read(vars).ok()?;
    let (rank, id, token, one) = l.twin_key();
    Some((rank, id.to_string(), token.map(str::to_string), one))
}

/// The processes that are twins of this PE (see the module documentation). Empty when this
/// process's environment does not describe `env` (a bootstrap made by hand) or `/proc` cannot
/// be read.
///
/// A PE that finds twins fails at once and exits, so a twin that looks later would find it
/// gone: every finding is also written down (a note in the runtime directory, named after the
/// job identity, listing the processes by pid and start time), and a PE named in a note of the
/// last `SYMHEAP_TIMEOUT` seconds is a twin as well.
pub(super) fn twins(env: &LaunchEnv, timeout: std::time::Duration) -> Vec<Twin> {
    if env.world < 2 {
        return Vec::new();
    }
    let mut mine: HashMap<String, String> = std::env::vars().collect();
    let Some(key) = key_of(&mut mine) else {
        return Vec::new();
    };
    let me = std::process::id() as i32;
    if key.0 != env.rank || Launch::read(&mut mine).map(|l| l.port).ok() != Some(env.port) {
        return Vec::new();
    }
    let exe = |pid: i32| std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let Some(my_exe) = exe(me) else {
        return Vec::new();
    };
    // This PE's family: its topmost ancestor whose environment makes it this same PE (a
    // wrapper that was given the launch variables), and everything below it.
    let family_root = lineage(me)
        .into_iter()
        .take_while(|&p| p == me || key_of(&mut environ(p)).as_ref() == Some(&key))
        .last()
        .unwrap_or(me);
    let mut out = scan(me, &my_exe, &key, family_root);
    if let Some(note) = Note::of(&key) {
        let Some(my_tag) = tag(me) else {
            return out;
        };
        if !out.is_empty() {
            let tags: Vec<String> = out.iter().filter_map(|t| tag(t.pid)).collect();
            note.add(&my_tag, &tags);
        }
        for (pid, _) in note.naming(&my_tag, timeout) {
            if !out.iter().any(|t| t.pid == pid) {
                out.push(Twin {
                    pid,
                    cmdline: "which found this PE first and has exited".into(),
                });
            }
        }
    }
    out
}

/// The twins of this PE among the processes running now.
fn scan(me: i32, my_exe: &std::path::Path, key: &Key, family_root: i32) -> Vec<Twin> {
    let exe = |pid: i32| std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let uid = nix::unistd::getuid().as_raw();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let same_user = std::os::unix::fs::MetadataExt::uid(&match e.metadata() {
            Ok(m) => m,
            Err(_) => continue,
        }) == uid;
        if pid == me || !same_user || exe(pid).as_deref() != Some(my_exe) {
            continue;
        }
        if key_of(&mut environ(pid)).as_ref() != Some(key) {
            continue;
        }
        if lineage(pid).contains(&family_root) || !seen.insert(pid) {
            continue;
        }
        out.push(Twin {
            pid,
            cmdline: cmdline(pid),
        });
    }
    out
}

/// Where the twins found for one job identity are written down (see [`twins`]).
struct Note(std::path::PathBuf);

impl Note {
    fn of(key: &Key) -> Option<Note> {
        let dir = super::unix::runtime_dir().ok()?;
        let id = format!("{}|{:?}|{}", key.1, key.2, key.3);
        Some(Note(dir.join(format!(
            "twins-{:016x}-{}.note",
            crate::util::fnv1a(id.as_bytes()),
            key.0
        ))))
    }

    /// Appends `me twin...` with the time; one short write, so lines never interleave.
    fn add(&self, me: &str, twins: &[String]) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // Kept small: old lines are of no use once their processes are gone.
        if std::fs::metadata(&self.0).is_ok_and(|m| m.len() > 64 << 10) {
            let _ = std::fs::remove_file(&self.0);
        }
        let line = format!("{now} {me} {}\n", twins.join(" "));
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .open(&self.0)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }

    /// The processes of lines of the last `window` that name `me`, by pid.
    fn naming(&self, me: &str, window: std::time::Duration) -> Vec<(i32, String)> {
        let Ok(text) = std::fs::read_to_string(&self.0) else {
            return Vec::new();
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut out = Vec::new();
        for line in text.lines() {
            let mut f = line.split_whitespace();
            let Some(when) = f.next().and_then(|t| t.parse::<u64>().ok()) else {
                continue;
            };
            let tags: Vec<&str> = f.collect();
            if now.saturating_sub(when) > window.as_secs().max(1) || !tags.contains(&me) {
                continue;
            }
            for t in tags.into_iter().filter(|&t| t != me) {
                if let Some(pid) = t.split(':').next().and_then(|p| p.parse().ok()) {
                    out.push((pid, t.to_string()));
                }
            }
        }
        out
    }
}

fn cmdline(pid: i32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let s: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let s = s.join(" ").split_whitespace().collect::<Vec<_>>().join(" ");
    if s.chars().count() > 120 {
        format!("{}...", s.chars().take(117).collect::<String>())
    } else {
        s
    }
}

/// The message every PE that meets twins fails with.
pub(super) fn message(env: &LaunchEnv, place: &str, twins: &[Twin]) -> String {
    let who: Vec<String> = twins
        .iter()
        .take(3)
        .map(|t| format!("pid {} ({})", t.pid, t.cmdline))
        .collect();
    format!(
        "two jobs share the rendezvous at {place}: another process on this node is PE {} of a \
         job with the same launch environment (job {}): {}; give each job its own MASTER_PORT \
         or SYMHEAP_TOKEN (if it is left over from an earlier run, end it)",
        env.rank,
        env.fingerprint(),
        who.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn this_process_is_its_own_lineage_and_has_a_tag() {
        let me = std::process::id() as i32;
        let l = lineage(me);
        assert_eq!(l[0], me);
        assert!(l.len() >= 2, "no parent found: {l:?}");
        let t = tag(me).unwrap();
        assert!(t.starts_with(&format!("{me}:")), "{t}");
        assert_eq!(tag(me), tag(me), "a tag is stable");
    }

    #[test]
    fn notes_name_the_twins_of_a_finding_within_the_window() {
        let key: Key = (1, format!("note-test-{}", std::process::id()), None, true);
        let note = Note::of(&key).unwrap();
        let _ = std::fs::remove_file(&note.0);
        note.add("100:5", &["200:6".into(), "300:7".into()]);
        note.add("400:8", &["500:9".into()]);
        let w = Duration::from_secs(60);
        let mut got = note.naming("200:6", w);
        got.sort();
        assert_eq!(got, vec![(100, "100:5".into()), (300, "300:7".into())]);
        assert_eq!(note.naming("500:9", w), vec![(400, "400:8".into())]);
        // Another process with a reused pid (another start time) is not named.
        assert!(note.naming("200:77", w).is_empty());
        // Old findings do not count.
        std::fs::write(&note.0, "1000 100:5 200:6\n").unwrap();
        assert!(note.naming("200:6", w).is_empty());
        std::fs::remove_file(&note.0).unwrap();
    }

    #[test]
    fn launch_variables_of_another_process_give_its_key() {
        let vars = |rank: &str, port: &str| -> HashMap<String, String> {
            [
                ("RANK", rank),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", port),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
        };
        let a = key_of(&mut vars("1", "29500")).unwrap();
        assert_eq!(a, key_of(&mut vars("1", "29500")).unwrap());
        assert_ne!(a, key_of(&mut vars("0", "29500")).unwrap());
        assert_ne!(a, key_of(&mut vars("1", "29501")).unwrap());
        let mut tok = vars("1", "29500");
        tok.insert("SYMHEAP_TOKEN".into(), "x".into());
        assert_ne!(a, key_of(&mut tok).unwrap());
        // Not a PE of a job at all.
        assert!(key_of(&mut HashMap::new()).is_none_or(|k| k.1.ends_with(":1")));
    }
}
