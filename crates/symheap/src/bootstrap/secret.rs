//! The user's secret: what a job across nodes without `SYMHEAP_TOKEN` derives its token from,
//! so that another user who knows every detail of the job still cannot join it.
//!
//! A file only this user can read, like an ssh key: `SYMHEAP_SECRET_FILE`, else
//! `$XDG_CONFIG_HOME/symheap/secret`, else `~/.config/symheap/secret`. The first job that needs
//! it creates it (32 random bytes as hex, mode 0600, in a 0700 directory) atomically: written
//! under a temporary name and linked into place, so PEs racing to create it all end up reading
//! the same one. PEs on nodes that do not share the file have different tokens, and the
//! rendezvous refuses them naming both job identities.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::fstat;

use crate::error::{bootstrap, Error, Result};

/// Where the user's secret is: `SYMHEAP_SECRET_FILE`, else under `XDG_CONFIG_HOME`, else under
/// `~/.config`; `None` if none of these is set.
pub(crate) fn secret_path() -> Option<PathBuf> {
    let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(f) = set("SYMHEAP_SECRET_FILE") {
        Some(PathBuf::from(f))
    } else if let Some(x) = set("XDG_CONFIG_HOME") {
        Some(PathBuf::from(x).join("symheap").join("secret"))
    } else {
        set("HOME").map(|h| PathBuf::from(h).join(".config/symheap/secret"))
    }
}

fn serr(path: &Path, what: impl std::fmt::Display) -> Error {
    bootstrap(
        "init",
        format!(
            "the rendezvous of a job across nodes without SYMHEAP_TOKEN proves membership with \
             the user secret file {}, but {what}; set SYMHEAP_TOKEN to the same random string \
             on every PE, or SYMHEAP_SECRET_FILE to a file only you can read",
            path.display()
        ),
    )
}

/// The user's secret, read from `path`, or created there when it does not exist.
pub(crate) fn user_secret(path: &Path) -> Result<Vec<u8>> {
    match read(path) {
        Ok(Some(s)) => return Ok(s),
        Ok(None) => {}
        Err(e) => return Err(serr(path, e)),
    }
    create(path).map_err(|e| serr(path, e))?;
    match read(path) {
        Ok(Some(s)) => Ok(s),
        Ok(None) => Err(serr(path, "it vanished right after it was created")),
        Err(e) => Err(serr(path, e)),
    }
}

/// The secret in `path`; `None` if there is no such file. Refuses a file that is not a regular
/// file of this user closed to everyone else (what it holds would not be a secret), or empty.
fn read(path: &Path) -> std::result::Result<Option<Vec<u8>>, String> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
        .open(path)
    {
        Ok(f) => f,
        // Absent (or a path through something that is not a directory): try to create it,
        // which names what stands in the way.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err("it is a symbolic link, which symheap does not follow".into())
        }
        Err(e) => return Err(format!("it cannot be opened: {e}")),
    };
    let st = fstat(f.as_fd()).map_err(|e| format!("it cannot be examined: {e}"))?;
    let me = nix::unistd::getuid().as_raw();
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err("it is not a regular file".into());
    }
    if st.st_uid != me {
        return Err(format!(
            "it belongs to uid {}, not to this user ({me})",
            st.st_uid
        ));
    }
    if st.st_mode & 0o077 != 0 {
        return Err(format!(
            "other users may read it (mode {:o}): chmod 600 it, or remove it to have a new one \
             made",
            st.st_mode & 0o777
        ));
    }
    let mut s = Vec::new();
    f.take(64 << 10)
        .read_to_end(&mut s)
        .map_err(|e| format!("it cannot be read: {e}"))?;
    let s = s.trim_ascii().to_vec();
    if s.len() < 16 {
        return Err("it holds fewer than 16 bytes: not a secret".into());
    }
    Ok(Some(s))
}

/// Creates the secret file (and its directory, 0700) unless another process does first.
fn create(path: &Path) -> std::result::Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("its directory cannot be created: {e}"))?;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no random bytes for it: {e}"))?;
    let mut text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    text.push('\n');
    let tmp = dir.join(format!(
        ".secret.{}.{:08x}",
        std::process::id(),
        u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(OFlag::O_CLOEXEC.bits())
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            f.sync_all()
        });
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(()),
        // Another PE made it first: everyone reads that one.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("it does not exist and cannot be created: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("symheap-secret-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn created_once_private_and_shared_by_racing_processes() {
        let d = scratch("race");
        let path = d.join("sub/secret");
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let p = path.clone();
                std::thread::spawn(move || user_secret(&p).unwrap())
            })
            .collect();
        let got: Vec<Vec<u8>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(got.iter().all(|g| g == &got[0]), "racing creators disagree");
        assert_eq!(got[0].len(), 64);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let dmode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dmode & 0o777, 0o700);
        // No temporary file is left behind.
        let left: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(left.len(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_secret_that_can_be_neither_read_nor_created_is_named() {
        let d = scratch("nowhere");
        std::fs::create_dir_all(&d).unwrap();
        // Its directory would have to be made inside a regular file.
        let blocker = d.join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let e = user_secret(&blocker.join("secret"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot be created") && e.contains("SYMHEAP_TOKEN"),
            "{e}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_secret_others_can_read_is_refused() {
        let d = scratch("open");
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("secret");
        std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = user_secret(&path).unwrap_err().to_string();
        assert!(
            e.contains("other users may read it") && e.contains("SYMHEAP_TOKEN"),
            "{e}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            user_secret(&path).unwrap(),
            b"0123456789abcdef0123456789abcdef"
        );
        let link = d.join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let e = user_secret(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
