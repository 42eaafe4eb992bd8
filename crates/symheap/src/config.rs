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
    pub topology: TopologyChoice,
    /// How collectives of a team that spans nodes run on the CUDA backend
    /// (`SYMHEAP_NODES_ALGO`).
    pub nodes_algo: NodesAlgo,
    /// Which images of symheap's own kernels the CUDA backend may load (`SYMHEAP_KERNEL_IMAGE`):
    /// embedded ones the driver can load, else NVRTC's (the default), or only one of the two.
    pub kernel_image: crate::backend::cuda::KernelImage,
    /// `(name, value)` of every `SYMHEAP_*` and launcher variable that was read and set.
    pub env_read: Vec<(String, String)>,
}

/// What the CUDA backend takes the links between its GPUs to be (`SYMHEAP_TOPOLOGY`): NVML's
/// answer, or an override (see `backend/cuda/topology.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TopologyChoice {
    /// Ask NVML.
    #[default]
    Auto,
    /// Treat every pair of GPUs as NVLink-connected.
    NvLink,
    /// Treat every pair of GPUs as connected without NVLink.
    Pcie,
}

impl TopologyChoice {
    /// Parses `auto`, `nvlink` or `pcie`.
    pub fn parse(s: &str) -> Option<TopologyChoice> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Some(TopologyChoice::Auto),
            "nvlink" => Some(TopologyChoice::NvLink),
            "pcie" => Some(TopologyChoice::Pcie),
            _ => None,
        }
    }
}

/// How collectives of a team whose members sit on several nodes run on the CUDA backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodesAlgo {
    /// Hierarchical (symheap's kernels inside each node, NCCL between nodes) where every node
    /// holds the same number of the team's PEs, all directly reachable from each other; NCCL
    /// over the whole team otherwise.
    #[default]
    Auto,
    /// NCCL over the whole team, always (the fallback, and the comparison).
    Nccl,
}

impl NodesAlgo {
    /// Parses `auto`, `hier` (the same as `auto`) or `nccl`.
    pub fn parse(s: &str) -> Option<NodesAlgo> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "hier" | "hierarchical" => Some(NodesAlgo::Auto),
            "nccl" => Some(NodesAlgo::Nccl),
            _ => None,
        }
    }
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
            topology: TopologyChoice::Auto,
            nodes_algo: NodesAlgo::Auto,
            kernel_image: crate::backend::cuda::KernelImage::Auto,
            env_read: Vec::new(),
        }
    }
}

/// Every environment variable symheap itself interprets, for the banner and the README.
pub const SYMHEAP_VARIABLES: &[(&str, &str)] = &[
    (
        "SYMHEAP_HEAP_CAPACITY",
        "address space per PE, e.g. 16G (default 16G, at most 64T)",
    ),
    (
        "SYMHEAP_CHUNK_SIZE",
        "physical growth step, e.g. 64M (default 64M)",
    ),
    (
        "SYMHEAP_TIMEOUT",
        "seconds any wait may take before failing (default 120; 0.001 to 1e9)",
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
        "SYMHEAP_SECRET_FILE",
        "the user secret a job across nodes without SYMHEAP_TOKEN derives its token from (default ~/.config/symheap/secret)",
    ),
    (
        "SYMHEAP_BOOTSTRAP_PORT",
        "rendezvous port (default MASTER_PORT, or MASTER_PORT+1 under torchrun)",
    ),
    (
        "SYMHEAP_NODE_ID",
        "override the node identity (default hostname + boot id)",
    ),
    (
        "SYMHEAP_RUNTIME_DIR",
        "where node-local sockets live (default $XDG_RUNTIME_DIR/symheap or /tmp/symheap-<uid>)",
    ),
    (
        "SYMHEAP_NVSHMEM_LIB",
        "libnvshmem_host.so.3 (or its directory) for the NVSHMEM provider",
    ),
    (
        "SYMHEAP_NVRTC_LIB",
        "libnvrtc.so.13 or .so.12 (or a directory holding them) for kernels not prebuilt, alone (default: the nvidia-cuda-nvrtc and nvidia-cuda-nvrtc-cu12 wheels on the Python path, a CUDA toolkit, the loader's path; of those found, one whose cubins the driver loads)",
    ),
    (
        "SYMHEAP_NVRTC",
        "12 | 13: use only an NVRTC of this CUDA major version",
    ),
    (
        "SYMHEAP_KERNEL_IMAGE",
        "auto | prebuilt | prebuilt-cu12 | prebuilt-cu13 | nvrtc: which images of symheap's kernels init may load (default auto: an embedded one the driver loads, else the cache or NVRTC)",
    ),
    (
        "SYMHEAP_TOPOLOGY",
        "auto | nvlink | pcie: what the links between GPUs are taken to be when choosing the collective protocols (LL128 needs NVLink; default: ask NVML)",
    ),
    (
        "SYMHEAP_NODES_ALGO",
        "auto | nccl: collectives of a team spanning nodes on GPUs, hierarchical (symheap inside nodes, NCCL between) where the layout allows, or NCCL over the whole team (default auto)",
    ),
    (
        "SYMHEAP_NCCL_LIB",
        "libnccl.so.2 (or its directory) for collectives across nodes (default: the nvidia-nccl-cu13 wheel on the Python path, then the loader's path)",
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
            c.capacity = parse_size(&v)
                .map_err(|e| invalid("init", format!("SYMHEAP_HEAP_CAPACITY={e}")))?;
            check_capacity(c.capacity).map_err(|e| {
                invalid(
                    "init",
                    format!("SYMHEAP_HEAP_CAPACITY={v:?} is not accepted: {e}"),
                )
            })?;
        }
        if let Some(v) = c.read("SYMHEAP_CHUNK_SIZE") {
            c.chunk_size =
                parse_size(&v).map_err(|e| invalid("init", format!("SYMHEAP_CHUNK_SIZE={e}")))?;
        }
        if let Some(v) = c.read("SYMHEAP_TIMEOUT") {
            let secs: f64 = v.trim().parse().map_err(|_| {
                invalid(
                    "init",
                    format!("SYMHEAP_TIMEOUT={v:?} is not a number of seconds: {TIMEOUT_RANGE}"),
                )
            })?;
            c.timeout = timeout_from_secs(secs).map_err(|e| {
                invalid(
                    "init",
                    format!("SYMHEAP_TIMEOUT={v:?} is not accepted: {e}"),
                )
            })?;
        }
        if let Some(v) = c.read("SYMHEAP_BACKEND") {
            c.backend = match v.trim().to_ascii_lowercase().as_str() {
                "auto" => BackendChoice::Auto,
                "host" => BackendChoice::Host,
                "cuda" => BackendChoice::Cuda,
                _ => {
                    return Err(invalid(
                        "init",
                        format!(
                            "SYMHEAP_BACKEND={v:?} is not accepted: expected host, cuda or auto"
                        ),
                    ))
                }
            };
        }
        if let Some(v) = c.read("SYMHEAP_DEVICE") {
            c.device = Some(v.trim().parse().map_err(|_| {
                invalid(
                    "init",
                    format!(
                        "SYMHEAP_DEVICE={v:?} is not accepted: expected a CUDA device ordinal \
                         (0, 1, ...)"
                    ),
                )
            })?);
        }
        if let Some(v) = c.read("SYMHEAP_TOPOLOGY") {
            c.topology = TopologyChoice::parse(&v).ok_or_else(|| {
                invalid(
                    "init",
                    format!("SYMHEAP_TOPOLOGY={v:?}: expected auto, nvlink or pcie"),
                )
            })?;
        }
        if let Some(v) = c.read("SYMHEAP_NODES_ALGO") {
            c.nodes_algo = NodesAlgo::parse(&v).ok_or_else(|| {
                invalid(
                    "init",
                    format!("SYMHEAP_NODES_ALGO={v:?}: expected auto or nccl"),
                )
            })?;
        }
        if let Some(v) = c.read("SYMHEAP_KERNEL_IMAGE") {
            c.kernel_image = crate::backend::cuda::KernelImage::parse(&v).ok_or_else(|| {
                invalid(
                    "init",
                    format!(
                        "SYMHEAP_KERNEL_IMAGE={v:?}: expected auto, prebuilt, prebuilt-cu12, \
                         prebuilt-cu13 or nvrtc"
                    ),
                )
            })?;
        }
        if let Some(v) = c.read("SYMHEAP_NVRTC") {
            crate::backend::cuda::nvrtc::check_forced_major(&v).map_err(|e| invalid("init", e))?;
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

/// The longest wait accepted: about 31 years, far below where `Instant + timeout` overflows.
pub const MAX_TIMEOUT_SECS: f64 = 1e9;
/// The shortest: a millisecond (a shorter one would fail every wait before it starts).
pub const MIN_TIMEOUT_SECS: f64 = 1e-3;
const TIMEOUT_RANGE: &str = "expected 0.001 to 1e9 seconds";

/// `secs` as a wait limit, or what is accepted instead (`0.001` to `1e9` seconds). Refusing
/// rather than clamping keeps a typo (`1e19`) from meaning "forever".
pub fn timeout_from_secs(secs: f64) -> std::result::Result<Duration, String> {
    if !(MIN_TIMEOUT_SECS..=MAX_TIMEOUT_SECS).contains(&secs) {
        return Err(TIMEOUT_RANGE.to_string());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The largest heap capacity per PE accepted: 64 TiB, half of the 128 TiB of address space a
/// Linux x86-64 process has (each PE reserves a slot for every PE of its node, so the
/// reservation is capacity times local PEs; that is checked when it is made).
pub const MAX_CAPACITY: u64 = 64 << 40;

/// `Ok` for a heap capacity (bytes per PE) of at most [`MAX_CAPACITY`], else what is accepted.
pub fn check_capacity(bytes: u64) -> std::result::Result<(), String> {
    if bytes == 0 || bytes > MAX_CAPACITY {
        return Err("expected 1 byte to 64 TiB of address space per PE, such as 16G".into());
    }
    Ok(())
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

const SIZE_RANGE: &str = "expected a size from 1 byte to 16 EiB, such as 4096, 64M or 16G";

/// Parses `1073741824`, `64M`, `64MiB`, `16G`, `1.5G` (binary multiples). The error begins with
/// the value as typed and says what is accepted.
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
        _ => return Err(format!("{s:?} is not a size: {SIZE_RANGE}")),
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size: {SIZE_RANGE}"))?;
    let bytes = value * mult as f64;
    if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("{s:?} is not accepted: {SIZE_RANGE}"));
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
    fn huge_and_tiny_timeouts_are_refused_with_the_range() {
        for bad in [
            1e300,
            1e19,
            1e10,
            f64::INFINITY,
            f64::NAN,
            0.0,
            -1.0,
            1e-300,
        ] {
            let e = timeout_from_secs(bad).unwrap_err();
            assert_eq!(e, "expected 0.001 to 1e9 seconds", "{bad}");
        }
        assert_eq!(
            timeout_from_secs(1e9).unwrap(),
            Duration::from_secs(1_000_000_000)
        );
        assert_eq!(timeout_from_secs(0.25).unwrap(), Duration::from_millis(250));
        // The longest accepted still leaves room for deadlines.
        assert!(std::time::Instant::now()
            .checked_add(timeout_from_secs(MAX_TIMEOUT_SECS).unwrap())
            .is_some());
    }

    #[test]
    fn size_errors_name_the_value_and_the_range() {
        assert_eq!(
            parse_size("0").unwrap_err(),
            "\"0\" is not accepted: expected a size from 1 byte to 16 EiB, such as 4096, 64M or 16G"
        );
        assert!(parse_size("lots")
            .unwrap_err()
            .starts_with("\"lots\" is not a size: expected"));
        assert!(check_capacity(1 << 62).unwrap_err().contains("64 TiB"));
        assert!(check_capacity(MAX_CAPACITY).is_ok());
        assert!(check_capacity(0).is_err());
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
