//! The on-disk cache of compiled kernels: NVRTC runs once per source, arch and driver, not at
//! every start.

use std::path::PathBuf;

/// Where cubins are kept: `SYMHEAP_CACHE_DIR`, else `$XDG_CACHE_HOME/symheap`, else
/// `~/.cache/symheap`, else the temp dir.
pub(crate) fn dir() -> PathBuf {
    if let Ok(d) = std::env::var("SYMHEAP_CACHE_DIR") {
        if !d.is_empty() {
            return PathBuf::from(d);
        }
    }
    if let Ok(x) = std::env::var("XDG_CACHE_HOME") {
        if !x.is_empty() {
            return PathBuf::from(x).join("symheap");
        }
    }
    match std::env::var("HOME") {
        Ok(h) if !h.is_empty() => PathBuf::from(h).join(".cache").join("symheap"),
        _ => std::env::temp_dir().join("symheap-cache"),
    }
}

/// The cache file for sources with hash `h` ([`super::prebuilt::source_hash`]) compiled for
/// `arch` under driver `driver` by NVRTC `nvrtc`.
pub(crate) fn path(h: u64, arch: u32, driver: i32, nvrtc: (i32, i32)) -> PathBuf {
    dir().join(format!(
        "kernels-{h:016x}-sm{arch}-drv{driver}-nvrtc{}.{}.cubin",
        nvrtc.0, nvrtc.1
    ))
}

/// A cached image, if present.
pub(crate) fn load(p: &std::path::Path) -> Option<Vec<u8>> {
    std::fs::read(p).ok().filter(|b| !b.is_empty())
}

/// Stores an image; failures only cost a recompile next time.
pub(crate) fn store(p: &std::path::Path, image: &[u8]) {
    let Some(parent) = p.parent() else { return };
    if std::fs::create_dir_all(parent).is_err() {
        return;
    }
    // Write then rename, so a concurrent reader never sees half a file.
    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, image).is_ok() {
        let _ = std::fs::rename(&tmp, p);
    }
    let _ = std::fs::remove_file(&tmp);
}
