//! Run-time settings: defaults, the `SYMHEAP_*` environment variables, and what was read.

use std::time::Duration;

use crate::error::{invalid, Result};

/// Which memory/execution backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// CUDA when a GPU is visible, the host otherwise.
    Auto,
    /// Shared host memory between CPU processes.
    Host,
    /// CUDA VMM memory on the GPU.
    Cuda,
}

/// How much `init` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DebugLevel {
    /// Nothing.
    Off,
    /// The banner (version, backend, layout, environment) at init.
    Info,
}

/// Settings for a context. `Config::from_env()` applies the environment on top of the defaults;
/// the builder methods of [`crate::ContextBuilder`] override both.
#[derive(Debug, Clone)]
pub struct Config {
    /// Virtual address space reserved per PE; the heap can grow up to this.
    pub capacity: u64,
    /// Physical memory is added in chunks of this size (rounded to the backend's granularity).
    pub chunk_size: u64,
    /// Every wait gives up after this long and names who did not arrive.
    pub timeout: Duration,
    /// Backend selection.
    pub backend: BackendChoice,
    /// Banner printing.
    pub debug: DebugLevel,
    /// CUDA device ordinal; None = LOCAL_RANK modulo the device count.
    pub device: Option<usize>,
    /// Tuning constants of the collective kernels (`SYMHEAP_COLL_DEFINES`): each becomes a
    /// `#define` ahead of the kernel source, and the launcher reads the grid-shaping ones.
    pub coll_defines: Vec<(String, u64)>,
    /// What the CUDA backend takes the links between GPUs to be when it picks the collective
    /// protocols (`SYMHEAP_TOPOLOGY`; default: ask NVML).
    pub topology: crate::backend::cuda::TopologyChoice,
    /// `(name, value)` of every `SYMHEAP_*` and launcher variable that was read and set.
    pub env_read: Vec<(String, String)>,
}

/// Default heap capacity per PE: large, because it is only reserved address space.
pub const DEFAULT_CAPACITY: u64 = 16 << 30;
/// Default physical growth step.
pub const DEFAULT_CHUNK_SIZE: u64 = 64 << 20;
/// Default wait limit.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Default allocation alignment, as in NVSHMEM and torch SymmetricMemory.
pub const DEFAULT_ALIGNMENT: u64 = 256;

impl Default for Config {
    fn default() -> Self {
        Config {
            capacity: DEFAULT_CAPACITY,
            chunk_size: DEFAULT_CHUNK_SIZE,
            timeout: DEFAULT_TIMEOUT,
            backend: BackendChoice::Auto,
            debug: DebugLevel::Off,
            device: None,
            coll_defines: Vec::new(),
            topology: crate::backend::cuda::TopologyChoice::Auto,
            env_read: Vec::new(),
        }
    }
}

/// Every environment variable symheap itself interprets, for the banner and the README.
pub const SYMHEAP_VARIABLES: &[(&str, &str)] = &[
    (
        "SYMHEAP_HEAP_CAPACITY",
        "address space per PE, e.g. 16G (default 16G)",
    ),
    (
        "SYMHEAP_CHUNK_SIZE",
        "physical growth step, e.g. 64M (default 64M)",
    ),
    (
        "SYMHEAP_TIMEOUT",
        "seconds any wait may take before failing (default 120)",
    ),
    ("SYMHEAP_BACKEND", "host | cuda | auto (default auto)"),
    (
        "SYMHEAP_DEVICE",
        "CUDA device ordinal (default LOCAL_RANK mod count)",
    ),
    ("SYMHEAP_DEBUG", "info: print the banner at init"),
    (
        "SYMHEAP_TOKEN",
        "job secret for the rendezvous (the launcher sets it)",
    ),
    (
        "SYMHEAP_BOOTSTRAP_PORT",
        "rendezvous port (default MASTER_PORT, or MASTER_PORT+1 under torchrun)",
    ),
    (
        "SYMHEAP_NODE_ID",
        "override the node identity (default hostname + boot id)",
    ),
    ("SYMHEAP_RUNTIME_DIR", "where node-local sockets live"),
    (
        "SYMHEAP_NVSHMEM_LIB",
        "libnvshmem_host.so.3 (or its directory) for the NVSHMEM provider",
    ),
    (
        "SYMHEAP_NVRTC_LIB",
        "libnvrtc.so.13 (or its directory) for kernels not prebuilt (default: the nvidia-cuda-nvrtc wheel on the Python path, then the loader's path)",
    ),
    (
        "SYMHEAP_TOPOLOGY",
        "auto | nvlink | pcie: what the links between GPUs are taken to be when choosing the collective protocols (LL128 needs NVLink; default: ask NVML)",
    ),
    (
        "SYMHEAP_COLL_DEFINES",
        "tuning: NAME=VALUE,... collective-kernel constants (SYMHEAP_COLL_*), for experiments",
    ),
];

impl Config {
    /// Defaults overridden by the environment. A malformed value is an error, not ignored.
    pub fn from_env() -> Result<Config> {
        let mut c = Config::default();
        if let Some(v) = c.read("SYMHEAP_HEAP_CAPACITY") {
            c.capacity = parse_size(&v).map_err(|e| invalid("init", e))?;
        }
        if let Some(v) = c.read("SYMHEAP_CHUNK_SIZE") {
            c.chunk_size = parse_size(&v).map_err(|e| invalid("init", e))?;
        }
        if let Some(v) = c.read("SYMHEAP_TIMEOUT") {
            let secs: f64 = v.trim().parse().map_err(|_| {
                invalid(
                    "init",
                    format!("SYMHEAP_TIMEOUT={v:?} is not a number of seconds"),
                )
            })?;
            if !(secs > 0.0 && secs.is_finite()) {
                return Err(invalid(
                    "init",
                    format!("SYMHEAP_TIMEOUT={v:?} must be positive"),
                ));
            }
            c.timeout = Duration::from_secs_f64(secs);
        }
        if let Some(v) = c.read("SYMHEAP_BACKEND") {
            c.backend = match v.trim().to_ascii_lowercase().as_str() {
                "auto" | "" => BackendChoice::Auto,
                "host" | "cpu" => BackendChoice::Host,
                "cuda" | "gpu" => BackendChoice::Cuda,
                other => {
                    return Err(invalid(
                        "init",
                        format!("SYMHEAP_BACKEND={other:?}: expected host, cuda or auto"),
                    ))
                }
            };
        }
        if let Some(v) = c.read("SYMHEAP_DEVICE") {
            c.device = Some(v.trim().parse().map_err(|_| {
                invalid(
                    "init",
                    format!("SYMHEAP_DEVICE={v:?} is not a device ordinal"),
                )
            })?);
        }
        if let Some(v) = c.read("SYMHEAP_TOPOLOGY") {
            c.topology = crate::backend::cuda::TopologyChoice::parse(&v).ok_or_else(|| {
                invalid(
                    "init",
                    format!("SYMHEAP_TOPOLOGY={v:?}: expected auto, nvlink or pcie"),
                )
            })?;
        }
        if let Some(v) = c.read("SYMHEAP_COLL_DEFINES") {
            c.coll_defines = parse_coll_defines(&v).map_err(|e| invalid("init", e))?;
        }
        if let Some(v) = c.read("SYMHEAP_DEBUG") {
            c.debug = match v.trim().to_ascii_lowercase().as_str() {
                "" | "0" | "off" | "none" => DebugLevel::Off,
                _ => DebugLevel::Info,
            };
        }
        Ok(c)
    }

    /// Reads a variable, remembering it for the banner when set.
    pub(crate) fn read(&mut self, name: &str) -> Option<String> {
        let v = std::env::var(name).ok()?;
        self.note(name, &v);
        Some(v)
    }

    pub(crate) fn note(&mut self, name: &str, value: &str) {
        if !self.env_read.iter().any(|(n, _)| n == name) {
            let shown = if name == "SYMHEAP_TOKEN" {
                "(set, hidden)".to_string()
            } else {
                value.to_string()
            };
            self.env_read.push((name.to_string(), shown));
        }
    }
}

/// Parses `SYMHEAP_COLL_DEFINES`: comma-separated `NAME=VALUE`, NAME an identifier starting with
/// `SYMHEAP_COLL_`, VALUE a size as [`parse_size`] reads it or 0. Anything else is refused, so
/// the variable cannot inject arbitrary source into the kernels.
pub fn parse_coll_defines(s: &str) -> std::result::Result<Vec<(String, u64)>, String> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let bad = || {
            format!(
                "SYMHEAP_COLL_DEFINES: {item:?} is not NAME=VALUE with NAME SYMHEAP_COLL_* and \
                 VALUE a size"
            )
        };
        let (name, value) = item.split_once('=').ok_or_else(bad)?;
        let name = name.trim();
        let ident = name.len() > "SYMHEAP_COLL_".len()
            && name.starts_with("SYMHEAP_COLL_")
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !ident {
            return Err(bad());
        }
        let value = match value.trim() {
            "0" => 0,
            v => parse_size(v).map_err(|_| bad())?,
        };
        out.retain(|(n, _)| n != name);
        out.push((name.to_string(), value));
    }
    Ok(out)
}

/// Parses `1073741824`, `64M`, `64MiB`, `16G`, `1.5G` (binary multiples).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("{s:?} is not a size (examples: 4096, 64M, 16G)")),
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 4096, 64M, 16G)"))?;
    let bytes = value * mult as f64;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("16g").unwrap(), 16 << 30);
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("12Q").is_err());
    }

    #[test]
    fn coll_defines_parse() {
        let d = parse_coll_defines("SYMHEAP_COLL_LL_MAX=128K, SYMHEAP_COLL_BCAST_PUSH=0").unwrap();
        assert_eq!(
            d,
            vec![
                ("SYMHEAP_COLL_LL_MAX".to_string(), 128 << 10),
                ("SYMHEAP_COLL_BCAST_PUSH".to_string(), 0)
            ]
        );
        // The last value of a repeated name wins.
        let d = parse_coll_defines("SYMHEAP_COLL_X=1,SYMHEAP_COLL_X=2").unwrap();
        assert_eq!(d, vec![("SYMHEAP_COLL_X".to_string(), 2)]);
        assert!(parse_coll_defines("").unwrap().is_empty());
        for bad in [
            "LL_MAX=4",
            "SYMHEAP_COLL_=4",
            "SYMHEAP_COLL_X",
            "SYMHEAP_COLL_X=-1",
            "SYMHEAP_COLL_X=4;int y",
            "SYMHEAP_COLL_x=4",
            "SYMHEAP_COLL_X 1=4",
        ] {
            assert!(parse_coll_defines(bad).is_err(), "{bad}");
        }
    }
}
