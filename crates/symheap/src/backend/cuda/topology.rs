//! Which collective protocols the links between this job's GPUs allow.
//!
//! The LL128 kernels (coll.cu) rely on a 128-byte store issued by one warp instruction arriving
//! at the peer whole and in order. That holds over NVLink on the architectures it was verified
//! on (sm_90: H100/H200, where the kernels were measured exact over millions of messages) and
//! within one GPU; over PCIe, or on an architecture nobody checked, it is not promised, and
//! LL128 could return wrong sums without an error. NCCL enables its LL128 only on topologies it
//! has verified, for the same reason. So LL128 is used only when every pair of GPUs holding PEs
//! of this node is connected by NVLink (asked of NVML) and the GPU is on the verified list;
//! otherwise the flag-based kernels run. Every PE must pick the same kernels, so the PEs agree
//! at init: LL128 only if every PE allows it.
//!
//! `SYMHEAP_TOPOLOGY=nvlink|pcie` replaces NVML's answer about the links (to test the selection
//! both ways, or to switch LL128 off); the architecture list still applies.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};

use super::driver::Device;
use crate::bootstrap::Bootstrap;
use crate::config::TopologyChoice;
use crate::error::{bootstrap, Result};

/// Architectures (major, minor) on which LL128's whole-line stores were verified over NVLink.
pub const LL128_VERIFIED: &[(i32, i32)] = &[(9, 0)];

/// The protocols every PE of the job runs, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protocols {
    /// Whether the LL128 kernels may be used.
    pub ll128: bool,
    /// Why (for the banner and `symheap info`).
    pub why: String,
}

/// What the links between this GPU and the other GPUs of the job are, as far as LL128 goes:
/// `Ok(())` when all are NVLink (or there are no others), `Err(reason)` otherwise.
pub(crate) type LinkVerdict = std::result::Result<(), String>;

/// This PE's verdict on LL128: the architecture, then the links to every other GPU in `peers`
/// (UUID strings of the other PEs' GPUs, this GPU's own excluded), from `links` (NVML's answer
/// or the override).
pub(crate) fn local_verdict(
    cc: (i32, i32),
    peers: &[String],
    links: impl Fn(&str) -> LinkVerdict,
) -> LinkVerdict {
    if !LL128_VERIFIED.contains(&cc) {
        return Err(format!(
            "sm_{}{} is not an architecture LL128 was verified on (sm_90)",
            cc.0, cc.1
        ));
    }
    for p in peers {
        links(p)?;
    }
    Ok(())
}

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVML and nvidia-smi spell a device UUID.
pub(crate) fn uuid_string(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// Collective at init: every PE's GPU and verdict, combined into the protocols every PE runs.
pub(crate) fn agree(
    boot: &dyn Bootstrap,
    dev: &Device,
    direct: &[bool],
    choice: TopologyChoice,
) -> Result<Protocols> {
    let mine = uuid_string(&dev.uuid);
    let uuids = boot.all_gather("init topology", mine.as_bytes())?;
    let uuids: Vec<String> = uuids
        .iter()
        .map(|u| String::from_utf8_lossy(u).into_owned())
        .collect();
    let mut peers: Vec<String> = uuids
        .iter()
        .zip(direct)
        .filter(|(u, &d)| d && **u != mine)
        .map(|(u, _)| u.clone())
        .collect();
    peers.sort();
    peers.dedup();
    let verdict = if choice == TopologyChoice::Pcie {
        // Forced off even when every PE shares one GPU: the override is how LL128 is switched
        // off, and how a test checks the selection both ways on any machine.
        Err("SYMHEAP_TOPOLOGY=pcie: the GPUs are taken as connected without NVLink".to_string())
    } else {
        local_verdict(dev.cc, &peers, |peer| match choice {
            TopologyChoice::Auto => nvml_nvlink(&mine, peer),
            _ => Ok(()),
        })
    };
    let ballot = match &verdict {
        Ok(()) => vec![1u8],
        Err(why) => [&[0u8][..], why.as_bytes()].concat(),
    };
    let all = boot.all_gather("init protocols", &ballot)?;
    if let Some((pe, b)) = all.iter().enumerate().find(|(_, b)| b.first() != Some(&1)) {
        if b.is_empty() {
            return Err(bootstrap(
                "init",
                format!("PE {pe} sent an empty protocol ballot"),
            ));
        }
        return Ok(Protocols {
            ll128: false,
            why: format!(
                "LL128 off, flag-based kernels instead (PE {pe}: {})",
                String::from_utf8_lossy(&b[1..])
            ),
        });
    }
    let why = if peers.is_empty() {
        "LL128 on (every PE of the node on one GPU)".to_string()
    } else if choice == TopologyChoice::NvLink {
        "LL128 on (SYMHEAP_TOPOLOGY=nvlink)".to_string()
    } else {
        "LL128 on (NVLink between every pair of GPUs, sm_90)".to_string()
    };
    Ok(Protocols { ll128: true, why })
}

type NvmlInit = unsafe extern "C" fn() -> c_int;
type NvmlHandleByUuid = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int;
type NvmlP2pStatus = unsafe extern "C" fn(*mut c_void, *mut c_void, c_uint, *mut c_uint) -> c_int;
/// `NVML_P2P_CAPS_INDEX_NVLINK` (nvml.h).
const P2P_CAPS_INDEX_NVLINK: c_uint = 2;
/// `NVML_P2P_STATUS_OK`.
const P2P_STATUS_OK: c_uint = 0;

/// NVML's entry points symheap uses, resolved once per process.
struct Nvml {
    by_uuid: NvmlHandleByUuid,
    p2p: NvmlP2pStatus,
}

fn nvml() -> std::result::Result<&'static Nvml, String> {
    static NVML: std::sync::OnceLock<std::result::Result<Nvml, String>> =
        std::sync::OnceLock::new();
    NVML.get_or_init(|| {
        // SAFETY: loading the driver's NVML runs only its C initialisers. It is never unloaded
        // (the function pointers below live as long as the process).
        let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }.map_err(|e| {
            format!("NVML (libnvidia-ml.so.1) cannot be loaded to ask about NVLink: {e}")
        })?;
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        // SAFETY: NVML's documented C entry points with these signatures (nvml.h, every driver
        // since R450); the library stays loaded.
        let (init, by_uuid, p2p) = unsafe {
            (
                lib.get::<NvmlInit>(b"nvmlInit_v2\0").map(|s| *s),
                lib.get::<NvmlHandleByUuid>(b"nvmlDeviceGetHandleByUUID\0").map(|s| *s),
                lib.get::<NvmlP2pStatus>(b"nvmlDeviceGetP2PStatus\0").map(|s| *s),
            )
        };
        let (Ok(init), Ok(by_uuid), Ok(p2p)) = (init, by_uuid, p2p) else {
            return Err("NVML lacks nvmlDeviceGetP2PStatus; cannot tell whether the GPUs are NVLink-connected".into());
        };
        // SAFETY: nvmlInit_v2 has no preconditions and may be called more than once.
        let rc = unsafe { init() };
        if rc != 0 {
            return Err(format!("nvmlInit failed with status {rc}"));
        }
        Ok(Nvml { by_uuid, p2p })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Asks NVML (the driver's `libnvidia-ml.so.1`) whether GPUs `a` and `b` (UUID strings) are
/// connected by NVLink.
fn nvml_nvlink(a: &str, b: &str) -> LinkVerdict {
    let api = nvml()?;
    let handle = |u: &str| -> std::result::Result<*mut c_void, String> {
        let c = CString::new(u).map_err(|_| "a GPU UUID holds a NUL byte".to_string())?;
        let mut h = std::ptr::null_mut();
        // SAFETY: `c` is a NUL-terminated UUID string; `h` receives one device handle.
        let rc = unsafe { (api.by_uuid)(c.as_ptr(), &mut h) };
        if rc != 0 {
            return Err(format!("NVML does not know GPU {u} (status {rc})"));
        }
        Ok(h)
    };
    let (ha, hb) = (handle(a)?, handle(b)?);
    let mut status: c_uint = u32::MAX;
    // SAFETY: two device handles from NVML and a writable status word.
    let rc = unsafe { (api.p2p)(ha, hb, P2P_CAPS_INDEX_NVLINK, &mut status) };
    if rc != 0 {
        return Err(format!(
            "nvmlDeviceGetP2PStatus({a}, {b}) failed with status {rc}"
        ));
    }
    if status == P2P_STATUS_OK {
        Ok(())
    } else {
        Err(format!(
            "{a} and {b} are not connected by NVLink (NVML P2P status {status})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ll128_needs_a_verified_arch_and_nvlink_to_every_peer() {
        let nv = |_: &str| Ok(());
        let pcie = |p: &str| Err(format!("{p} over PCIe"));
        assert_eq!(local_verdict((9, 0), &[], nv), Ok(()));
        assert_eq!(local_verdict((9, 0), &["GPU-b".into()], nv), Ok(()));
        let e = local_verdict((9, 0), &["GPU-b".into()], pcie).unwrap_err();
        assert!(e.contains("GPU-b over PCIe"), "{e}");
        let e = local_verdict((8, 0), &[], nv).unwrap_err();
        assert!(e.contains("sm_80") && e.contains("verified"), "{e}");
        let e = local_verdict((10, 0), &["GPU-b".into()], nv).unwrap_err();
        assert!(e.contains("sm_100"), "{e}");
    }

    #[test]
    fn the_override_parses_and_uuids_print_as_nvml_spells_them() {
        assert_eq!(TopologyChoice::parse("PCIe"), Some(TopologyChoice::Pcie));
        assert_eq!(
            TopologyChoice::parse("nvlink"),
            Some(TopologyChoice::NvLink)
        );
        assert_eq!(TopologyChoice::parse(""), Some(TopologyChoice::Auto));
        assert_eq!(TopologyChoice::parse("fast"), None);
        let u = [
            0x3e, 0x4b, 0x97, 0x10, 0xc5, 0xe4, 0x9f, 0x89, 0x56, 0x34, 0xfe, 0x96, 0x9b, 0x1e,
            0xc2, 0xaa,
        ];
        assert_eq!(uuid_string(&u), "GPU-3e4b9710-c5e4-9f89-5634-fe969b1ec2aa");
    }
}
