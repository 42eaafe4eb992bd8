//! Finding a shared library that may come from a pip wheel (`nvidia-cuda-nvrtc`,
//! `nvidia-nvshmem-cu13`), an environment variable or the system: one search order for every
//! library symheap loads at run time, and error messages that name every place looked.
//!
//! Why by hand: the dynamic loader only knows `LD_LIBRARY_PATH` and the system directories, and
//! a pip user has NVIDIA's libraries under `site-packages/nvidia/...`, which the loader never
//! searches (torch preloads them by path for the same reason).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What is looked for and where a wheel keeps it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Library {
    /// The loader name, e.g. `libnvrtc.so.13`.
    pub(crate) file: &'static str,
    /// The variable naming the file (or its directory), e.g. `SYMHEAP_NVRTC_LIB`.
    pub(crate) env: &'static str,
    /// The wheel's library folder under a Python search directory, e.g. `nvidia/cu13/lib`.
    pub(crate) wheel_dir: &'static str,
    /// The wheel, for messages, e.g. `nvidia-cuda-nvrtc`.
    pub(crate) wheel: &'static str,
}

/// One place a library is looked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// A file path, or the bare file name for the loader's own search.
    pub(crate) path: PathBuf,
    /// Where the candidate came from, for the error message.
    pub(crate) origin: String,
    /// Only a file path: skipped (reported as absent) when the file does not exist.
    pub(crate) is_file: bool,
}

impl Library {
    fn as_file(&self, p: &Path) -> PathBuf {
        if p.is_dir() {
            p.join(self.file)
        } else {
            p.to_path_buf()
        }
    }

    /// Where to look, in order: `explicit` alone when given, else the environment variable's
    /// value alone when set (a file or a directory holding it; neither falls back, so a wrong
    /// setting is an error rather than a surprise), else the wheel's library folder under every
    /// Python search directory in `site_dirs`, else the loader's own search path.
    pub(crate) fn candidates(
        &self,
        explicit: Option<&Path>,
        env: Option<&OsStr>,
        site_dirs: &[PathBuf],
    ) -> Vec<Candidate> {
        if let Some(p) = explicit {
            return vec![Candidate {
                path: self.as_file(p),
                origin: "the path given".into(),
                is_file: true,
            }];
        }
        if let Some(v) = env.filter(|v| !v.is_empty()) {
            return vec![Candidate {
                path: self.as_file(Path::new(v)),
                origin: self.env.into(),
                is_file: true,
            }];
        }
        let mut out: Vec<Candidate> = Vec::new();
        for d in site_dirs {
            let path = d.join(self.wheel_dir).join(self.file);
            if !out.iter().any(|c| c.path == path) {
                out.push(Candidate {
                    path,
                    origin: format!("the {} Python package", self.wheel),
                    is_file: true,
                });
            }
        }
        out.push(Candidate {
            path: PathBuf::from(self.file),
            origin: "the dynamic loader's search path".into(),
            is_file: false,
        });
        out
    }

    /// The candidates for this process: the environment variable, then the Python search path
    /// ([`python_sys_path`], asked only when the variable is unset), then the loader. The second
    /// value says why there are no Python directories, when there are none.
    pub(crate) fn search(&self) -> (Vec<Candidate>, Option<String>) {
        let env = std::env::var_os(self.env).filter(|v| !v.is_empty());
        let (dirs, note) = if env.is_some() {
            (Vec::new(), None)
        } else {
            python_sys_path()
        };
        (self.candidates(None, env.as_deref(), &dirs), note)
    }

    /// Tries `open` on every candidate in order and returns the first success; otherwise an
    /// error naming every candidate and why it was not used, `note`, and how to fix it.
    pub(crate) fn load_first<T>(
        &self,
        cands: &[Candidate],
        note: Option<&str>,
        mut open: impl FnMut(&Candidate) -> Result<T, String>,
    ) -> Result<T, String> {
        let mut tried = Vec::new();
        for c in cands {
            if c.is_file && !c.path.is_file() {
                tried.push(format!("{} ({}): no such file", c.path.display(), c.origin));
                continue;
            }
            match open(c) {
                Ok(v) => return Ok(v),
                Err(why) => tried.push(format!("{} ({}): {why}", c.path.display(), c.origin)),
            }
        }
        let mut msg = format!("cannot load {}; looked in: {}", self.file, tried.join("; "));
        if let Some(n) = note {
            msg.push_str(&format!(" ({n})"));
        }
        msg.push_str(&format!(
            ". Set {} to the library (or its directory), or `pip install {}` (found through the Python search path)",
            self.env, self.wheel
        ));
        Err(msg)
    }
}

/// The Python search path given by [`set_python_path`], if any.
static PYTHON_PATH: Mutex<Option<Vec<PathBuf>>> = Mutex::new(None);

/// Tells every later library search which Python directories to look in (`sys.path` of the
/// interpreter this process runs, given by the Python package at import) instead of asking the
/// `python3` on PATH.
pub(crate) fn set_python_path(dirs: Vec<PathBuf>) {
    *PYTHON_PATH.lock().unwrap_or_else(|p| p.into_inner()) = Some(dirs);
}

/// The Python search directories where pip puts NVIDIA's wheels: those given by
/// [`set_python_path`], else the `sys.path` of the `python3` on PATH. Empty (with the reason)
/// when there is no usable python3.
pub(crate) fn python_sys_path() -> (Vec<PathBuf>, Option<String>) {
    if let Some(d) = PYTHON_PATH
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
    {
        return (d, None);
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys\nfor p in sys.path:\n    if p: print(p)"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => (
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(PathBuf::from)
                .collect(),
            None,
        ),
        Ok(o) => (
            Vec::new(),
            Some(format!("python3 could not list sys.path ({})", o.status)),
        ),
        Err(e) => (
            Vec::new(),
            Some(format!("no python3 to ask for its site-packages ({e})")),
        ),
    }
}

/// A loader error with its cause (libloading puts dlerror's text in the source).
pub(crate) fn with_source(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(s) => format!("{e}: {s}"),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: Library = Library {
        file: "libx.so.1",
        env: "SYMHEAP_X_LIB",
        wheel_dir: "nvidia/x/lib",
        wheel: "nvidia-x",
    };

    #[test]
    fn search_order() {
        let site = vec![
            PathBuf::from("/a"),
            PathBuf::from("/b"),
            PathBuf::from("/a"),
        ];
        let c = LIB.candidates(Some(Path::new("/given/libx.so.1")), None, &site);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].path, PathBuf::from("/given/libx.so.1"));
        let c = LIB.candidates(None, Some(OsStr::new("/env/libx.so")), &site);
        assert_eq!((c.len(), c[0].origin.as_str()), (1, "SYMHEAP_X_LIB"));
        let c = LIB.candidates(None, Some(OsStr::new("")), &site);
        let paths: Vec<_> = c.iter().map(|c| c.path.clone()).collect();
        assert_eq!(
            paths,
            vec![
                PathBuf::from("/a/nvidia/x/lib/libx.so.1"),
                PathBuf::from("/b/nvidia/x/lib/libx.so.1"),
                PathBuf::from("libx.so.1"),
            ]
        );
        assert!(!c[2].is_file);
    }

    #[test]
    fn a_failed_search_names_every_place() {
        let c = LIB.candidates(None, None, &[PathBuf::from("/nowhere")]);
        let e = LIB
            .load_first(&c, Some("why"), |_| Err::<(), _>("refused".to_string()))
            .unwrap_err();
        assert!(
            e.contains(
                "/nowhere/nvidia/x/lib/libx.so.1 (the nvidia-x Python package): no such file"
            ),
            "{e}"
        );
        assert!(
            e.contains("libx.so.1 (the dynamic loader's search path): refused"),
            "{e}"
        );
        assert!(
            e.contains("(why)")
                && e.contains("SYMHEAP_X_LIB")
                && e.contains("pip install nvidia-x"),
            "{e}"
        );
    }
}
