//! Node-local Unix sockets: the per-user runtime directory they live in, sockets left behind by
//! killed processes, and the path of a one-node job's rendezvous socket.
//!
//! The directory is the boundary other users cannot cross: it is created 0700, and one that is
//! a symbolic link, belongs to someone else or cannot be closed is refused rather than used
//! (with the `/tmp/symheap-<uid>` fallback, another user could plant a link there).

use std::collections::HashSet;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::fcntl::{open, OFlag};
use nix::sys::socket::{getsockopt, sockopt};
use nix::sys::stat::{fchmod, fstat, Mode};

use crate::error::{bootstrap, Error, Result};
use crate::util::fnv1a;

/// A socket file younger than this may belong to a listener being set up right now (between
/// its bind and its listen), so the stale-socket sweep leaves it alone.
const STALE_AFTER: Duration = Duration::from_secs(2);
/// `sun_path` holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

fn rerr(what: impl std::fmt::Display) -> Error {
    bootstrap("runtime directory", what.to_string())
}

/// Where node-local sockets live: `SYMHEAP_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/symheap`, else
/// `/tmp/symheap-<uid>`. Computes the path only; [`runtime_dir`] creates and checks it.
pub(crate) fn runtime_dir_path() -> PathBuf {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(d) = set("SYMHEAP_RUNTIME_DIR") {
        PathBuf::from(d)
    } else if let Some(x) = set("XDG_RUNTIME_DIR") {
        PathBuf::from(x).join("symheap")
    } else {
        PathBuf::from(format!("/tmp/symheap-{}", nix::unistd::getuid()))
    }
}

/// The runtime directory, created 0700 if missing and checked: a real directory (never a
/// symbolic link followed), owned by this user, closed to others (tightened to 0700 if not).
pub(crate) fn runtime_dir() -> Result<PathBuf> {
    let dir = runtime_dir_path();
    match std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&dir)
    {
        Ok(()) => {}
        // A dangling symbolic link lands here; the check below names it.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(rerr(format!("cannot create {}: {e}", dir.display()))),
    }
    check_dir(&dir, true)?;
    Ok(dir)
}

/// Checks `dir` through a descriptor opened without following a final symbolic link, so what
/// is checked (and chmod'ed, when `tighten`) is the directory itself. `Ok(false)`: it does not
/// exist (yet).
pub(crate) fn check_dir(dir: &Path, tighten: bool) -> Result<bool> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = match open(dir, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(false),
        // O_NOFOLLOW with O_DIRECTORY reports a symbolic link as ENOTDIR, alone as ELOOP.
        Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => {
            let link = std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink());
            let what = if link {
                "is a symbolic link; symheap does not follow it (another user may have planted \
                 it)"
            } else {
                "is not a directory"
            };
            return Err(rerr(format!(
                "{} {what}: remove it, or set SYMHEAP_RUNTIME_DIR to a directory of your own",
                dir.display()
            )));
        }
        Err(e) => return Err(rerr(format!("cannot open {}: {e}", dir.display()))),
    };
    let st = fstat(fd.as_fd()).map_err(|e| rerr(format!("{}: {e}", dir.display())))?;
    let me = nix::unistd::getuid().as_raw();
    if st.st_uid != me {
        return Err(rerr(format!(
            "{} belongs to uid {}, not to this user (uid {me}); set SYMHEAP_RUNTIME_DIR to a \
             directory of your own",
            dir.display(),
            st.st_uid
        )));
    }
    if tighten && st.st_mode & 0o077 != 0 {
        fchmod(fd.as_fd(), Mode::from_bits_truncate(0o700)).map_err(|e| {
            rerr(format!(
                "{} is open to other users and cannot be closed: {e}",
                dir.display()
            ))
        })?;
    }
    Ok(true)
}

/// The rendezvous socket of a job whose PEs all run on this node: named after the job identity
/// (the token every PE derives or is given), so every PE finds it without talking first.
pub(crate) fn rendezvous_path(dir: &Path, token: &[u8]) -> Result<PathBuf> {
    let path = dir.join(format!("rdv-{:016x}.sock", fnv1a(token)));
    check_path_len(&path)?;
    Ok(path)
}

/// The lock a one-node job's PE 0 holds on its rendezvous for the job's whole life: a file
/// beside the socket, `flock`ed. Only its holder may remove and bind the socket, so a live
/// socket is never replaced (a second PE 0 of the same job identity finds the lock taken and
/// presents itself instead), while a killed PE 0's lock goes with it and its socket is
/// replaced. The holder removes the file before it lets the lock go; a process that locked a
/// file already removed (it opened it just before) sees that the path no longer names it, and
/// tries again.
pub(crate) struct RendezvousLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
    path: PathBuf,
}

impl RendezvousLock {
    /// Takes the lock of the rendezvous socket `socket`; `None` if a live process holds it.
    pub(crate) fn take(socket: &Path) -> Result<Option<RendezvousLock>> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let path = socket.with_extension("lock");
        loop {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
                .open(&path)
                .map_err(|e| rerr(format!("cannot open the lock file {}: {e}", path.display())))?;
            let lock =
                match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                    Ok(lock) => lock,
                    Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(None),
                    Err((_, e)) => {
                        return Err(rerr(format!("cannot lock {}: {e}", path.display())))
                    }
                };
            let held = lock.metadata().ok();
            let named = std::fs::symlink_metadata(&path).ok();
            let same = matches!((held, named), (Some(a), Some(b))
                if a.ino() == b.ino() && a.dev() == b.dev());
            if same {
                return Ok(Some(RendezvousLock { _lock: lock, path }));
            }
        }
    }
}

impl Drop for RendezvousLock {
    fn drop(&mut self) {
        // Removed while still locked: nobody can lock this file after it is gone from the path.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A clear error for a path longer than a Unix socket address holds.
pub(crate) fn check_path_len(path: &Path) -> Result<()> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(rerr(format!(
            "the socket path {} is {len} bytes, more than the {MAX_SOCKET_PATH} a Unix socket \
             address holds; set SYMHEAP_RUNTIME_DIR to a shorter directory",
            path.display()
        )));
    }
    Ok(())
}

/// The uid and pid of the process at the other end of `s` (SO_PEERCRED).
pub(crate) fn peer_cred(s: &UnixStream) -> Option<(u32, i32)> {
    getsockopt(s, sockopt::PeerCredentials)
        .ok()
        .map(|c| (c.uid(), c.pid()))
}

/// Paths of the Unix sockets listening in this network namespace (`/proc/net/unix`, flag
/// `__SO_ACCEPTCON`), read without connecting to any of them.
fn listening_paths() -> Option<HashSet<PathBuf>> {
    const ACCEPTCON: u32 = 0x0001_0000;
    let text = std::fs::read_to_string("/proc/net/unix").ok()?;
    let mut out = HashSet::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            continue;
        }
        let listening = u32::from_str_radix(f[3], 16).is_ok_and(|x| x & ACCEPTCON != 0);
        if listening {
            out.insert(PathBuf::from(f[7..].join(" ")));
        }
    }
    Some(out)
}

/// Removes the `*.sock` files in `dir` that nobody listens on: what a killed node leader or
/// rendezvous root left behind. A socket someone listens on, or one created in the last two
/// seconds (its listener may be starting), is kept; so is anything that is not a socket.
pub(crate) fn remove_stale_sockets(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let listening = listening_paths();
    let now = SystemTime::now();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "sock") {
            continue;
        }
        // DirEntry::metadata does not follow symbolic links.
        let Ok(md) = e.metadata() else { continue };
        let old = md
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if !md.file_type().is_socket() || !old {
            continue;
        }
        if listening.as_ref().is_some_and(|l| l.contains(&path)) {
            continue;
        }
        // Not listed (or no /proc): a connection attempt settles it; refused means no listener.
        let refused = UnixStream::connect(&path)
            .is_err_and(|err| err.kind() == std::io::ErrorKind::ConnectionRefused);
        if refused && std::fs::remove_file(&path).is_ok() {
            tracing::info!("removed the stale socket {}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("symheap-unix-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn age(path: &Path) {
        let past = nix::sys::time::TimeSpec::new(1_000_000, 0);
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            path,
            &past,
            &past,
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .unwrap();
    }

    #[test]
    fn stale_sockets_go_live_ones_and_other_files_stay() {
        let d = scratch("stale");
        let stale = d.join("0123456789abcdef-0-1.sock");
        drop(UnixListener::bind(&stale).unwrap());
        let live_path = d.join("rdv-live.sock");
        let live = UnixListener::bind(&live_path).unwrap();
        let fresh = d.join("fresh.sock");
        drop(UnixListener::bind(&fresh).unwrap());
        let plain = d.join("notes.sock");
        std::fs::write(&plain, b"not a socket").unwrap();
        for p in [&stale, &live_path, &plain] {
            age(p);
        }
        remove_stale_sockets(&d);
        assert!(!stale.exists(), "the stale socket is still there");
        assert!(live_path.exists(), "a socket with a listener was removed");
        assert!(fresh.exists(), "a socket bound just now was removed");
        assert!(plain.exists(), "a file that is not a socket was removed");
        drop(live);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_symlinked_directory_is_refused_and_its_target_untouched() {
        let d = scratch("link");
        let target = d.join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = check_dir(&link, true).unwrap_err().to_string();
        assert!(e.contains("is a symbolic link"), "{e}");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&target).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o755, "the link's target was chmod'ed");
        // A regular directory open to others is closed to 0700.
        check_dir(&target, true).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&target).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o700);
        assert!(!check_dir(&d.join("absent"), true).unwrap());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn overlong_socket_paths_are_named() {
        let d = PathBuf::from(format!("/tmp/{}", "x".repeat(120)));
        let e = rendezvous_path(&d, b"t").unwrap_err().to_string();
        assert!(e.contains("SYMHEAP_RUNTIME_DIR"), "{e}");
        let ok = rendezvous_path(Path::new("/tmp/s"), b"t").unwrap();
        assert!(ok.to_string_lossy().starts_with("/tmp/s/rdv-"));
    }
}
